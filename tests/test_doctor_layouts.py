"""The doctor on attention it has no layout for (found by running it over transformers' model zoo):
an eager softmax attention whose q and k it cannot reach, beside a linear attention it can (a
hybrid); a decoder's cross-attention that a forward never calls; a temperature that depends on
the query's position. Tiny modules written here, each a few lines."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention.doctor import examine


class OpaqueAttention(nn.Module):
    """Causal softmax attention computed eagerly, q and k out of one projection named like no
    known layout (Multi-head latent attention's are like this); `fill` replaces the future scores."""
    def __init__(self, d=16, heads=2, fill=float("-inf")):
        super().__init__()
        self.heads, self.fill = heads, fill
        self.mix_in, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.mix_in(x).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(C // self.heads)
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        w = torch.softmax(s.masked_fill(future, self.fill), dim=-1)
        return self.out(torch.matmul(w, v).transpose(1, 2).reshape(B, T, C))


class LinearAttention(nn.Module):
    """Causal linear attention (no softmax) with q_proj / k_proj: a known layout, no scores."""
    def __init__(self, d=16):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        q, k = F.elu(self.q_proj(x)) + 1, F.elu(self.k_proj(x)) + 1
        return torch.cumsum(k * self.v_proj(x), 1) * q / torch.cumsum(k * q, 1).clamp_min(1e-6)


class Hybrid(nn.Module):
    def __init__(self, fill=float("-inf")):
        super().__init__()
        self.linear, self.softmax = LinearAttention(), OpaqueAttention(fill=fill)

    def forward(self, x):
        x = x + self.linear(x)
        return x + self.softmax(x)


def test_softmax_layer_without_a_layout_beside_one_with_is_seen_and_amplified():
    torch.manual_seed(0)
    r = examine(Hybrid(), causal=True, checks=["eval_dropout", "self_visibility", "amplified_logits"], strict=True)
    assert r.info["attention_modules"] == 2 and r.info["qk_sites"] == 1
    assert r["self_visibility"].verdict == "pass"
    assert r["amplified_logits"].verdict == "pass", r["amplified_logits"].detail
    assert "inside the calls of 1 module" in r["amplified_logits"].detail
    torch.manual_seed(0)   # the same layer with a finite fill: the amplified scores go below it
    leaky = examine(Hybrid(fill=-1e4), causal=True, checks=["eval_dropout", "amplified_logits"], strict=True)
    assert leaky["amplified_logits"].verdict == "fail", leaky["amplified_logits"].detail


class Attention(nn.Module):
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x, memory=None, causal=True):
        B, T, C = x.shape
        src = x if memory is None else memory
        q, k, v = (p(t).view(B, -1, self.heads, C // self.heads).transpose(1, 2)
                   for p, t in ((self.q_proj, x), (self.k_proj, src), (self.v_proj, src)))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))


class DecoderLayer(nn.Module):
    """A decoder layer whose cross-attention runs only with encoder states (never, here)."""
    def __init__(self):
        super().__init__()
        self.self_attn, self.encoder_attn = Attention(), Attention()

    def forward(self, x, memory=None):
        x = x + self.self_attn(x)
        return x if memory is None else x + self.encoder_attn(x, memory, causal=False)


def test_a_site_no_forward_calls_is_left_out():
    torch.manual_seed(0)
    r = examine(DecoderLayer(), causal=True, checks=["eval_dropout", "score_scale"], strict=True)
    assert r["score_scale"].verdict == "pass", r["score_scale"].verdict
    assert r.info["qk_sites_not_called"] == ["encoder_attn"]


class TemperedRopeAttention(Attention):
    """Rotary attention whose queries are scaled by 1 + 0.1 log(1 + position) (a temperature by
    position, as Llama 4's and Beam's long-context layers); phases in float32 or bfloat16."""
    def __init__(self, d=16, heads=2, phase_dtype=torch.float32):
        super().__init__(d, heads)
        self.phase_dtype = phase_dtype

    def rope(self, t, pos):
        half = t.shape[-1] // 2
        inv = 1.0 / 10000 ** (torch.arange(half, device=t.device, dtype=torch.float32) / half)
        ph = (pos.to(self.phase_dtype)[:, None, :, None] * inv.to(self.phase_dtype)).float()
        a, b = t[..., :half], t[..., half:]
        return torch.cat([a * ph.cos() - b * ph.sin(), a * ph.sin() + b * ph.cos()], -1).to(t.dtype)

    def forward(self, x, pos):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        q = self.rope(q, pos) * (1 + 0.1 * torch.log1p(pos.to(q.dtype)))[:, None, :, None]
        y = F.scaled_dot_product_attention(q, self.rope(k, pos), v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))


class TemperedRopeLM(nn.Module):
    def __init__(self, vocab=16, d=16, phase_dtype=torch.float32):
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab, d), nn.Linear(d, vocab)
        self.attn = TemperedRopeAttention(d, phase_dtype=phase_dtype)

    def forward(self, ids, position_ids=None):
        pos = torch.arange(ids.shape[1], device=ids.device)[None] if position_ids is None else position_ids
        h = self.emb(ids)
        return self.head(h + self.attn(h, pos.expand(ids.shape[0], -1)))


def test_a_temperature_by_position_is_not_a_phase_error():
    torch.manual_seed(0)
    r = examine(TemperedRopeLM(), checks=["eval_dropout", "long_positions"], strict=True)
    assert r["long_positions"].verdict == "pass", r["long_positions"].detail
    assert "one factor per query" in r["long_positions"].detail
    torch.manual_seed(0)   # the same with the phases in bfloat16: the scores change key by key
    bad = examine(TemperedRopeLM(phase_dtype=torch.bfloat16), checks=["eval_dropout", "long_positions"], strict=True)
    assert bad["long_positions"].verdict == "fail", bad["long_positions"].detail


class _Config:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class CompositeLM(nn.Module):
    """A transformers-style multimodal LM: vocab_size only in the config's text part."""
    def __init__(self):
        super().__init__()
        text = _Config(vocab_size=16, max_position_embeddings=64)
        self.config = _Config(get_text_config=lambda: text)
        self.emb, self.head = nn.Embedding(16, 8), nn.Linear(8, 16)

    def get_input_embeddings(self):
        return self.emb

    def forward(self, input_ids, use_cache=False):
        return _Config(logits=self.head(self.emb(input_ids)))


def test_hf_adapter_reads_a_composite_config():
    from attention.doctor.hf import HFCausalLM
    a = HFCausalLM(CompositeLM())
    assert a.vocab_size == 16 and a.forward(torch.zeros(2, 4, dtype=torch.long)).shape == (2, 4, 16)


class LatentMixer(nn.Module):
    """Multi-head latent attention as DeepSeek-V2 names it: k per head is [kv_b_proj's nope part |
    a rope part shared by the heads, from kv_a_proj_with_mqa]; `scale` None: 1/sqrt(d_k). Its class
    name does not say attention (LongcatFlashMLA's does not): the layout alone marks it."""
    qk_nope_head_dim, qk_rope_head_dim, v_head_dim, kv_lora_rank, heads = 4, 2, 4, 6, 2

    def __init__(self, d=16, scale=None):
        super().__init__()
        H, n, r, v, lo = self.heads, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim, self.kv_lora_rank
        self.scale = scale
        self.q_proj, self.kv_a_proj_with_mqa = nn.Linear(d, H * (n + r)), nn.Linear(d, lo + r)
        self.kv_b_proj, self.o_proj = nn.Linear(lo, H * (n + v)), nn.Linear(H * v, d)

    def forward(self, x):
        B, T, _ = x.shape
        H, n, r, v = self.heads, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim
        q = self.q_proj(x).view(B, T, H, n + r).transpose(1, 2)
        latent, k_rot = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, r], -1)
        k_nope, val = self.kv_b_proj(latent).view(B, T, H, n + v).transpose(1, 2).split([n, v], -1)
        k = torch.cat([k_nope, k_rot[:, None].expand(B, H, T, r)], -1)
        y = F.scaled_dot_product_attention(q, k, val, is_causal=True, scale=self.scale)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, H * v))


def test_latent_attention_layout_makes_q_and_k_unit_variance():
    torch.manual_seed(0)
    r = examine(LatentMixer(), causal=True, checks=["eval_dropout", "score_scale"], strict=True)
    assert r.info["qk_sites"] == 1 and r["score_scale"].verdict == "pass", r["score_scale"].detail
    torch.manual_seed(0)   # no 1/sqrt(d_k): the std is sqrt(6)
    bad = examine(LatentMixer(scale=1.0), causal=True, checks=["eval_dropout", "score_scale"], strict=True)
    assert bad["score_scale"].verdict == "fail" and 2.0 < bad["score_scale"].measured < 3.0
