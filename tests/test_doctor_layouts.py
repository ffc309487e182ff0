"""The doctor on attention it has no layout for (found by running it over transformers' model zoo):
an eager softmax attention whose q and k it cannot reach, beside a linear attention it can (a
hybrid); a decoder's cross-attention that a forward never calls; a temperature that depends on
the query's position. Tiny modules written here, each a few lines."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_doctor import examine


class OpaqueAttention(nn.Module):
    """Causal softmax attention computed eagerly, q and k out of one projection named like no
    known layout, interleaved by head (its site is found by measurement); `fill` replaces the
    future scores."""
    def __init__(self, d=16, heads=2, fill=float("-inf")):
        super().__init__()
        self.heads, self.fill = heads, fill
        self.mix_in, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def project(self, x):
        return self.mix_in(x)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.project(x).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
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


class BareAttention(OpaqueAttention):
    """q, k and v from a bare weight (no projection module): nothing to find q and k in but the calls."""
    def __init__(self, d=16, heads=2, fill=float("-inf")):
        super().__init__(d, heads, fill)
        self.w_in = nn.Parameter(0.2 * torch.randn(3 * d, d))

    def project(self, x):
        return F.linear(x, self.w_in)


class Hybrid(nn.Module):
    def __init__(self, fill=float("-inf"), softmax=OpaqueAttention):
        super().__init__()
        self.linear, self.softmax = LinearAttention(), softmax(fill=fill)

    def forward(self, x):
        x = x + self.linear(x)
        return x + self.softmax(x)


def test_softmax_layer_without_a_layout_beside_one_with_is_seen_and_amplified():
    """Its fused projection, interleaved by head, is found by measurement; without a projection
    module, q and k are amplified inside its calls."""
    torch.manual_seed(0)
    r = examine(Hybrid(), causal=True, checks=["eval_dropout", "self_visibility", "amplified_logits"], strict=True)
    assert r.info["attention_modules"] == 2 and r.info["qk_sites"] == 2 and r.info["qk_sites_measured"] == ["softmax"]
    assert r["self_visibility"].verdict == "pass"
    assert r["amplified_logits"].verdict == "pass" and "at 1 q/k site(s))" in r["amplified_logits"].detail  # the linear one has no scores
    torch.manual_seed(0)
    r = examine(Hybrid(softmax=BareAttention), causal=True, checks=["eval_dropout", "amplified_logits"], strict=True)
    assert r.info["qk_sites"] == 1 and "qk_sites_measured" not in r.info
    assert r["amplified_logits"].verdict == "pass", r["amplified_logits"].detail
    assert "inside the calls of 1 module" in r["amplified_logits"].detail
    for softmax in (OpaqueAttention, BareAttention):   # a finite fill: the amplified scores go below it
        torch.manual_seed(0)
        leaky = examine(Hybrid(fill=-1e4, softmax=softmax), causal=True, checks=["eval_dropout", "amplified_logits"], strict=True)
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
    def __init__(self, d=16, heads=2, phase_dtype=torch.float32, temper=True):
        super().__init__(d, heads)
        self.phase_dtype, self.temper = phase_dtype, temper

    def rope(self, t, pos):
        half = t.shape[-1] // 2
        inv = 1.0 / 10000 ** (torch.arange(half, device=t.device, dtype=torch.float32) / half)
        ph = (pos.to(self.phase_dtype)[:, None, :, None] * inv.to(self.phase_dtype)).float()
        a, b = t[..., :half], t[..., half:]
        return torch.cat([a * ph.cos() - b * ph.sin(), a * ph.sin() + b * ph.cos()], -1).to(t.dtype)

    def forward(self, x, pos):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        q = self.rope(q, pos) * ((1 + 0.1 * torch.log1p(pos.to(q.dtype)))[:, None, :, None] if self.temper else 1)
        y = F.scaled_dot_product_attention(q, self.rope(k, pos), v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))


class TemperedRopeLM(nn.Module):
    """reset: position 0 marks a segment's start (RecurrentGemma resets its recurrence there)."""
    def __init__(self, vocab=16, d=16, phase_dtype=torch.float32, temper=True, reset=False):
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab, d), nn.Linear(d, vocab)
        self.attn = TemperedRopeAttention(d, phase_dtype=phase_dtype, temper=temper)
        self.start = nn.Parameter(0.02 * torch.randn(d)) if reset else None   # small: under ABSOLUTE_POS at +16

    def forward(self, ids, position_ids=None):
        pos = torch.arange(ids.shape[1], device=ids.device)[None] if position_ids is None else position_ids
        h = self.emb(ids)
        if self.start is not None:
            h = h + self.start * (pos == 0)[..., None]
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
    from attention_doctor.hf import HFCausalLM
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


class IdPositionLM(nn.Module):
    """RoBERTa's positions: counted over the tokens that are not the pad token (a transformers-style
    LM: config with pad_token_id, forward(input_ids, attention_mask))."""
    def __init__(self, vocab=16, d=16, pad=1):
        super().__init__()
        self.config = _Config(vocab_size=vocab, pad_token_id=pad, position_embedding_type="absolute",
                              max_position_embeddings=64)
        self.emb, self.pos, self.attn, self.head = nn.Embedding(vocab, d), nn.Embedding(64, d), Attention(d), nn.Linear(d, vocab)

    def get_input_embeddings(self):
        return self.emb

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        real = input_ids != self.config.pad_token_id
        pos = (real.long().cumsum(1) * real.long()) + self.config.pad_token_id
        h = self.emb(input_ids) + self.pos(pos)
        B, T, C = h.shape
        a = self.attn
        q, k, v = (p(h).view(B, T, a.heads, -1).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj))
        keep = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
        if attention_mask is not None:
            keep = keep & attention_mask.bool()[:, None, None, :]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return _Config(logits=self.head(h + a.o_proj(y.transpose(1, 2).reshape(B, T, C))))


def test_padding_uses_the_pad_token_where_the_model_has_one():
    from attention_doctor.hf import HFCausalLM
    torch.manual_seed(0)
    a = HFCausalLM(IdPositionLM())
    assert a.pad_id == 1
    r = examine(a, checks=["eval_dropout", "padding"], strict=True)
    assert r["padding"].verdict == "pass", r["padding"].detail
    a.pad_id = None   # padded with other ids, the positions shift
    assert examine(a, checks=["eval_dropout", "padding"], strict=True)["padding"].verdict == "fail"


class _NoBackwardInEval(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        raise AssertionError("use model.train() to train")


class TimeMajorLM(nn.Module):
    """An LM whose embedding runs on (T, B) ids (XLNet's) and whose backward refuses eval mode
    (Reformer's reversible layers)."""
    def __init__(self, vocab=16, d=16, backward=True):
        super().__init__()
        self.emb, self.attn, self.head = nn.Embedding(vocab, d), Attention(d), nn.Linear(d, vocab)
        self.backward_ok = backward

    def forward(self, ids):
        h = self.emb(ids.t()).transpose(0, 1)
        if not self.backward_ok:
            h = _NoBackwardInEval.apply(h)
        return self.head(h + self.attn(h))


def test_gradients_of_a_time_major_embedding_and_a_backward_that_refuses_eval():
    torch.manual_seed(0)
    r = examine(TimeMajorLM(), checks=["eval_dropout", "future_leak"], strict=True)
    assert r["future_leak"].verdict == "pass" and "max |g| = 0" in r["future_leak"].detail
    torch.manual_seed(0)
    r = examine(TimeMajorLM(backward=False), checks=["eval_dropout", "future_leak", "fully_masked_rows"], strict=True)
    # the backward refused: the half that ran held, the gradient half is named, and that is no pass
    # (tests/test_doctor_signals.py: the same for fully_masked_rows)
    row = r["future_leak"]
    assert row.verdict.startswith("inconclusive: the gradient half could not run (its backward raised in eval "
                                  "mode (AssertionError: use model.train() to train)"), row.verdict
    assert row.cause == "part_not_run" and row.measurements["not_run"] == ["the gradient half"], row
    assert row.measurements["outputs"] == [{"t": t, "change": 0.0} for t in (1, 8, 15)]
    assert row.measurements["gradient_max"] is None and r.exit_code == 3
    assert r["fully_masked_rows"].verdict.startswith("n/a: needs a padding mask"), r["fully_masked_rows"].verdict


class SinkAttention(OpaqueAttention):
    """gpt-oss's attention sinks: a learned logit per head beside the keys, the row maximum taken
    off before the softmax, the sink's weight dropped after."""
    def __init__(self, d=16, heads=2):
        super().__init__(d, heads)
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.sinks = nn.Parameter(torch.zeros(heads))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(C // self.heads)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), torch.finfo(s.dtype).min)
        s = torch.cat([s, self.sinks.view(1, -1, 1, 1).expand(B, -1, T, 1)], -1)
        w = torch.softmax(s - s.amax(-1, keepdim=True), dim=-1)[..., :-1]
        return self.out(torch.matmul(w, v).transpose(1, 2).reshape(B, T, C))


def test_scores_minus_their_row_maximum_are_amplified():
    torch.manual_seed(0)
    r = examine(SinkAttention(), causal=True, checks=["eval_dropout", "amplified_logits"], strict=True)
    assert r["amplified_logits"].verdict == "pass", r["amplified_logits"].verdict


class BlindFirstQuery(OpaqueAttention):
    """Query 0 sees no key (a cross-attention's empty patch, as BLT has): its row is all fill."""
    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.mix_in(x).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(C // self.heads)
        hide = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        hide[0] = True
        w = torch.softmax(s.masked_fill(hide, torch.finfo(s.dtype).min), dim=-1)
        return self.out(torch.matmul(w, v).transpose(1, 2).reshape(B, T, C))


def test_a_row_with_no_visible_key_is_not_a_leak():
    torch.manual_seed(0)
    r = examine(BlindFirstQuery(), causal=True, checks=["eval_dropout", "amplified_logits"], strict=True)
    assert "masked keys' largest weight: 0;" in r["amplified_logits"].detail, r["amplified_logits"].detail


def test_a_start_of_segment_marker_is_not_a_phase_error():
    torch.manual_seed(0)
    r = examine(TemperedRopeLM(temper=False, reset=True), checks=["eval_dropout", "long_positions"], strict=True)
    assert r["long_positions"].verdict == "pass" and "start position" in r["long_positions"].detail, \
        r["long_positions"].detail


class HotAttention(OpaqueAttention):
    """Scores a hundred times too large: a query's weight on its own key underflows to 0 beside
    its largest score (CPM-Ant at random init), though the key is not masked."""
    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.mix_in(x).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        s = 100 * torch.matmul(q, k.transpose(-2, -1))
        w = torch.softmax(s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")), dim=-1)
        return self.out(torch.matmul(w, v).transpose(1, 2).reshape(B, T, C))


def test_an_own_weight_that_underflows_is_not_a_masked_diagonal():
    torch.manual_seed(0)
    r = examine(HotAttention(), causal=True, checks=["eval_dropout", "self_visibility"], strict=True)
    assert r["self_visibility"].verdict == "pass", r["self_visibility"].detail
    assert "visible: 0" in r["self_visibility"].detail   # the weights alone would have failed it


class RenamedCacheLM(nn.Module):
    """A transformers-style causal LM whose forward takes its cache as `cache` and returns it under
    that name (transformers 5.25's Mamba renamed past_key_values so). off_by_one: the step reads the
    cache one key short (a shipped cache bug's pattern)."""
    def __init__(self, off_by_one=False):
        super().__init__()
        self.config = _Config(vocab_size=16)
        self.emb, self.qkv, self.head = nn.Embedding(16, 8), nn.Linear(8, 24), nn.Linear(8, 16)
        self.off_by_one = off_by_one

    def get_input_embeddings(self):
        return self.emb

    def forward(self, input_ids, cache=None, use_cache=False, attention_mask=None):
        h = self.emb(input_ids)
        q, k, v = self.qkv(h).chunk(3, -1)
        if cache is not None:
            past_k, past_v = cache
            if self.off_by_one:
                past_k, past_v = past_k[:, :-1], past_v[:, :-1]
            k, v = torch.cat([past_k, k], 1), torch.cat([past_v, v], 1)
        T_q, T_k = q.shape[1], k.shape[1]
        keep = torch.ones(T_q, T_k, dtype=torch.bool).tril(T_k - T_q)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return _Config(logits=self.head(h + y), cache=(k, v) if use_cache else None)


def test_a_cache_taken_under_another_name_is_driven_by_that_name():
    """kv_cache drives the cache under the name the forward takes (`cache`), reads it back from the
    output's field of that name: the healthy model passes, a step that reads one key short fails;
    neither is read as a model without a cache (n/a) or as the target raising."""
    from attention_doctor.hf import HFCausalLM
    torch.manual_seed(0)
    good = examine(HFCausalLM(RenamedCacheLM()), checks=["eval_dropout", "kv_cache"], strict=True)
    assert good["kv_cache"].verdict == "pass", good["kv_cache"].detail
    bad = examine(HFCausalLM(RenamedCacheLM(off_by_one=True)), checks=["eval_dropout", "kv_cache"], strict=True)
    assert bad["kv_cache"].verdict == "fail" and bad["kv_cache"].cause == "new_tokens_differ", bad["kv_cache"].detail
