"""The doctor on the attention patterns its zoos showed it misreading (issue 45), each a small module
written here, not the architecture that showed it: a kernel without float64 (MoE's grouped_mm),
a module class whose __new__ takes arguments (x-transformers' LoRALinear), a float32 router
(transformers' _keep_in_fp32_modules), q/k norms after the projections, a fused q|k|v beside idle
to_q / to_k, joint attention over two streams, attention sinks concatenated to the scores, memory
keys before the tokens' own, cross-attention, and multi-query attention packed queries outer, heads inner."""
import math
import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_doctor import Adapter, Layer, examine
from attention_doctor.adapters import deep_copy
from attention_doctor.result import INCONCLUSIVE, NA


def causal(T, off_by_one=False):
    """(T, T) bool, True = may attend; off_by_one hides the diagonal too."""
    return torch.ones(T, T, dtype=torch.bool).tril(-1 if off_by_one else 0)


class PositionsLM(nn.Module):
    """An LM with rotary-free relative behaviour: the outputs do not depend on the position ids
    at all; `no_float64` raises when its weights are float64 (a kernel without float64, as
    grouped_mm has none)."""
    def __init__(self, vocab=16, d=16, no_float64=False):
        super().__init__()
        self.no_float64 = no_float64
        self.emb, self.mix, self.head = nn.Embedding(vocab, d), nn.Linear(d, d), nn.Linear(d, vocab)

    def forward(self, ids, position_ids=None):
        if self.no_float64 and self.mix.weight.dtype == torch.float64:
            raise RuntimeError("Expected mat_a to be Float32, BFloat16 or Float16 matrix, got Double")
        return self.head(torch.tanh(self.mix(self.emb(ids))))


def test_long_positions_takes_float32_as_reference_where_float64_fails():
    torch.manual_seed(0)
    r = examine(PositionsLM(no_float64=True), checks=["eval_dropout", "long_positions"], strict=True)
    assert r["long_positions"].verdict == "pass", r["long_positions"].detail
    assert {b["reference"] for b in r["long_positions"].measurements["bfloat16"]} == {"float32"}
    torch.manual_seed(0)
    r = examine(PositionsLM(), checks=["eval_dropout", "long_positions"], strict=True)
    assert {b["reference"] for b in r["long_positions"].measurements["bfloat16"]} == {"float64"}


class LowRank(nn.Module):
    """A class whose __new__ takes arguments and may return another class (LoRALinear's way)."""
    def __new__(cls, d, rank=None):
        if rank is None:
            return nn.Linear(d, d)
        return super().__new__(cls)

    def __init__(self, d, rank=None):
        super().__init__()
        self.down, self.up = nn.Linear(d, rank), nn.Linear(rank, d)

    def forward(self, x):
        return self.up(self.down(x))


def test_a_module_whose_new_takes_arguments_is_copied():
    torch.manual_seed(0)
    m = nn.Sequential(LowRank(8, rank=2), LowRank(8))
    c = deep_copy(m)
    assert type(c[0]) is LowRank and c[0].down.weight is not m[0].down.weight
    x = torch.randn(2, 8)
    assert torch.equal(c(x), m(x))
    half = Layer(m).converted(dtype=torch.bfloat16)
    assert half.module[0].up.weight.dtype == torch.bfloat16 and m[0].up.weight.dtype == torch.float32


class RouterLM(nn.Module):
    """A transformers-style LM whose router runs in float32 (it says so in _keep_in_fp32_modules_strict):
    its input is cast to float32, so a float16 router weight raises."""
    _keep_in_fp32_modules_strict = ["router.weight"]

    def __init__(self, vocab=16, d=16):
        super().__init__()
        self.config = types.SimpleNamespace(vocab_size=vocab)
        self.emb, self.router, self.head = nn.Embedding(vocab, d), nn.Linear(d, 2, bias=False), nn.Linear(d, vocab)

    def get_input_embeddings(self):
        return self.emb

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        h = self.emb(input_ids)
        gate = torch.softmax(F.linear(h.float(), self.router.weight), -1)[..., :1].to(h.dtype)
        return types.SimpleNamespace(logits=self.head(h * gate))


def test_a_float32_router_stays_float32_in_the_low_precision_copy():
    from attention_doctor.hf import HFCausalLM
    torch.manual_seed(0)
    a = HFCausalLM(RouterLM())
    for dt in (torch.float16, torch.bfloat16):
        lp = a.converted(dtype=dt)
        assert lp.module.router.weight.dtype == torch.float32 and lp.module.head.weight.dtype == dt
        assert torch.isfinite(lp.forward(torch.zeros(2, 4, dtype=torch.long))).all()
    RouterLM._keep_in_fp32_modules_strict = []
    try:
        with pytest.raises(RuntimeError):
            a.converted(dtype=torch.float16).forward(torch.zeros(2, 4, dtype=torch.long))
    finally:
        RouterLM._keep_in_fp32_modules_strict = ["router.weight"]


class NormedAttention(nn.Module):
    """Self-attention with a LayerNorm per head on q and k after their projections (diffusers'
    norm_q / norm_k, SD3's and Flux's RMS norms): scaling the projections does not move the
    scores. Eager, causal; `fill` replaces the future scores (-1e4: a finite fill that leaks at
    large scores). `fused`: q|k|v out of one projection while idle to_q / to_k stay (diffusers'
    fuse_projections)."""
    def __init__(self, d=16, heads=2, fill=float("-inf"), fused=False):
        super().__init__()
        self.heads, self.fill, self.fused = heads, fill, fused
        self.to_q, self.to_k, self.to_v, self.to_out = (nn.Linear(d, d) for _ in range(4))
        self.to_qkv = nn.Linear(d, 3 * d)
        self.norm_q, self.norm_k = nn.LayerNorm(d // heads, eps=1e-2), nn.LayerNorm(d // heads, eps=1e-2)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.to_qkv(x).chunk(3, -1) if self.fused else (self.to_q(x), self.to_k(x), self.to_v(x))
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        q, k = self.norm_q(q), self.norm_k(k)
        s = (q / math.sqrt(C // self.heads)) @ k.transpose(-2, -1)
        w = torch.softmax(s.masked_fill(~causal(T), self.fill), -1)
        return self.to_out((w @ v).transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("fused", [False, True])
def test_scores_are_amplified_after_the_q_k_norms(fused):
    checks = ["eval_dropout", "amplified_logits", "low_precision", "score_scale"]
    torch.manual_seed(0)
    r = examine(NormedAttention(fused=fused), causal=True, checks=checks, strict=True)
    assert r.info["qk_sites_measured"] == [""]
    for c in checks:
        assert r[c].verdict == "pass", (c, r[c].verdict, r[c].detail)
    torch.manual_seed(0)   # the finite fill leaks only at scores the norms would hold near 1
    leaky = examine(NormedAttention(fill=-1e4, fused=fused), causal=True, checks=checks[:2], strict=True)
    assert leaky["amplified_logits"].verdict == "fail" and leaky["amplified_logits"].cause == "masked_key_weight"


class JointAttention(nn.Module):
    """Joint attention over two streams (SD3's, Flux's): each stream has its own projections and
    q/k norms, their q, k, v concatenated along the tokens; SDPA, bidirectional. `scale` None:
    1/sqrt(d_head)."""
    def __init__(self, d=16, heads=2, scale=None):
        super().__init__()
        self.heads, self.scale = heads, scale
        self.to_q, self.to_k, self.to_v, self.to_out = (nn.Linear(d, d) for _ in range(4))
        self.add_q, self.add_k, self.add_v = (nn.Linear(d, d) for _ in range(3))
        self.norm_q, self.norm_k, self.norm_add_q, self.norm_add_k = (nn.LayerNorm(d // heads) for _ in range(4))

    def forward(self, x):
        B, T, C = x.shape
        ctx = x.flip(1)   # the second stream: the same tokens, reversed
        split = lambda t: t.view(B, -1, self.heads, C // self.heads).transpose(1, 2)
        q = torch.cat([self.norm_q(split(self.to_q(x))), self.norm_add_q(split(self.add_q(ctx)))], 2)
        k = torch.cat([self.norm_k(split(self.to_k(x))), self.norm_add_k(split(self.add_k(ctx)))], 2)
        v = torch.cat([split(self.to_v(x)), split(self.add_v(ctx))], 2)
        y = F.scaled_dot_product_attention(q, k, v, scale=self.scale)[:, :, :T]
        return self.to_out(y.transpose(1, 2).reshape(B, T, C))


def test_joint_attention_has_one_site_over_both_streams():
    checks = ["eval_dropout", "amplified_logits", "score_scale"]
    torch.manual_seed(0)
    r = examine(JointAttention(), causal=False, checks=checks, strict=True)
    assert r.info["qk_sites"] == 1 and all(r[c].verdict == "pass" for c in checks), r.table()
    torch.manual_seed(0)   # no 1/sqrt(d_head): std sqrt(8)
    bad = examine(JointAttention(scale=1.0), causal=False, checks=checks, strict=True)
    assert bad["score_scale"].verdict == "fail" and 2.0 < bad["score_scale"].measured < 4.0


class SinkAttention(nn.Module):
    """gpt-oss's eager attention: a learned sink logit per head concatenated to the scores, a
    softmax over both, the sink's column dropped before @ v; q k^T before the scale
    (transformers #33317's order: with a head of 32, |q.k| passes 65504 at scores ~1.2e4).
    off_by_one: the causal mask hides the diagonal too (the first query then sees only the sink)."""
    def __init__(self, d=32, heads=1, off_by_one=False):
        super().__init__()
        self.heads, self.off_by_one = heads, off_by_one
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d) for _ in range(4))
        self.sinks = nn.Parameter(torch.randn(heads))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(C // self.heads)
        s = s.masked_fill(~causal(T, self.off_by_one), torch.finfo(s.dtype).min)
        logits = torch.cat([s, self.sinks.view(1, -1, 1, 1).expand(B, -1, T, 1)], dim=-1)
        logits = logits - logits.max(-1, keepdim=True).values
        w = torch.softmax(logits, -1)[..., :-1]
        return self.o_proj(torch.matmul(w, v).transpose(1, 2).reshape(B, T, C))


def test_sinks_concatenated_to_the_scores_are_followed():
    torch.manual_seed(0)
    r = examine(SinkAttention(), causal=True, checks=["eval_dropout", "self_visibility", "amplified_logits",
                                                     "low_precision", "score_scale"], strict=True)
    assert r["self_visibility"].verdict == "pass" and r["amplified_logits"].verdict == "pass", r.table()
    assert r["score_scale"].verdict == "pass", r["score_scale"].detail
    assert r["low_precision"].cause == "qk_before_scale", r["low_precision"].detail   # q k^T passes 65504 first
    torch.manual_seed(0)
    bad = examine(SinkAttention(off_by_one=True), causal=True, checks=["eval_dropout", "self_visibility"], strict=True)
    assert bad["self_visibility"].verdict == "fail" and bad["self_visibility"].measured == 32   # B T heads


class MemoryAttention(nn.Module):
    """x-transformers' memory key/values: learned keys and values before the tokens' own, visible
    to every query; SDPA (sdpa=True) or eager; off_by_one: the tokens' causal mask hides the
    diagonal."""
    def __init__(self, d=16, heads=2, mem=3, sdpa=False, off_by_one=False):
        super().__init__()
        self.heads, self.sdpa, self.off_by_one = heads, sdpa, off_by_one
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d) for _ in range(4))
        self.mem_k, self.mem_v = nn.Parameter(torch.randn(heads, mem, d // heads)), nn.Parameter(torch.randn(heads, mem, d // heads))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        k = torch.cat([self.mem_k.expand(B, -1, -1, -1), k], 2)
        v = torch.cat([self.mem_v.expand(B, -1, -1, -1), v], 2)
        keep = torch.cat([torch.ones(T, self.mem_k.shape[1], dtype=torch.bool), causal(T, self.off_by_one)], 1)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        else:
            s = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)
            y = torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("sdpa", [False, True])
def test_a_querys_own_key_among_memory_keys(sdpa):
    torch.manual_seed(0)
    r = examine(MemoryAttention(sdpa=sdpa), causal=True, checks=["eval_dropout", "self_visibility"], strict=True)
    assert r["self_visibility"].verdict == "pass", r["self_visibility"].detail
    torch.manual_seed(0)
    bad = examine(MemoryAttention(sdpa=sdpa, off_by_one=True), causal=True, checks=["eval_dropout", "self_visibility"],
                  strict=True)
    assert bad["self_visibility"].verdict == "fail", bad["self_visibility"].detail


class CrossLayer(Adapter):
    """A cross-attention layer: its queries attend to a context (here the input twice over)."""
    kind, causal, cross, d_model = "layer", False, True, 16

    def forward(self, x, mask=None, positions=None):
        q = self.module.q_proj(x)
        ctx = torch.cat([x, x], 1)
        return F.scaled_dot_product_attention(q, self.module.k_proj(ctx), self.module.v_proj(ctx))


def test_self_visibility_is_na_for_cross_attention():
    torch.manual_seed(0)
    m = nn.Module()
    m.q_proj, m.k_proj, m.v_proj = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)
    r = examine(CrossLayer(m), checks=["eval_dropout", "self_visibility"], strict=True)
    assert r["self_visibility"].outcome is NA and r["self_visibility"].cause == "cross_attention", \
        r["self_visibility"].verdict


class InPlaceScaleAttention(nn.Module):
    """Falcon's eager order: s = q @ k^T, then s /= sqrt(d_head) in place (q k^T before the scale,
    transformers #33317; a head of 32: |q.k| passes 65504 at scores ~1.2e4): the product the doctor
    saw must not change under it."""
    def __init__(self, d=32, heads=1):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        s = q @ k.transpose(-1, -2)
        s /= math.sqrt(C // self.heads)
        w = torch.softmax(s.masked_fill(~causal(T), float("-inf")), -1)
        return self.o_proj((w @ v).transpose(1, 2).reshape(B, T, C))


def test_a_scale_applied_in_place_is_read_as_applied_after_q_k():
    torch.manual_seed(0)
    r = examine(InPlaceScaleAttention(), causal=True, checks=["eval_dropout", "low_precision", "score_scale"], strict=True)
    assert r["score_scale"].verdict == "pass", r["score_scale"].detail
    assert r["low_precision"].cause == "qk_before_scale" and "before the scale 0.177" in r["low_precision"].detail, \
        r["low_precision"].detail


class GatedLinearAttention(nn.Module):
    """Linear attention with decay gates (Bailing's lightning attention, Kimi's KDA in one chunk):
    q k^T times exp(g_i - g_j) below the diagonal, then @ v; no softmax, no normalisation."""
    def __init__(self, d=16):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.g_proj = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, 1)

    def forward(self, x):
        T = x.shape[1]
        a = self.q_proj(x) @ self.k_proj(x).transpose(1, 2)
        g = F.logsigmoid(self.g_proj(x)).cumsum(1)                       # (B, T, 1)
        decay = torch.exp(g - g.transpose(1, 2)).masked_fill(~causal(T), 0.0)
        return (a * decay) @ self.v_proj(x)


class LinearHybrid(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear, self.softmax = GatedLinearAttention(), InPlaceScaleAttention(d=16, heads=2)

    def forward(self, x):
        x = x + self.linear(x)
        return x + self.softmax(x)


def test_an_exp_of_gates_is_not_a_hand_made_softmax():
    torch.manual_seed(0)
    r = examine(LinearHybrid(), causal=True, checks=["eval_dropout", "amplified_logits", "score_scale"], strict=True)
    assert r.info["attention_calls"] == {"softmax": 1}, r.info["attention_calls"]
    assert r["amplified_logits"].verdict == "pass" and r["score_scale"].verdict == "pass", r.table()


class L2NormAttention(nn.Module):
    """q and k L2-normalised by a function (no module to hook), times a learned scale
    (x-transformers' qk_norm, cosine-sim attention): scaling the projections leaves the scores."""
    def __init__(self, d=16, heads=2, fill=float("-inf")):
        super().__init__()
        self.heads, self.fill = heads, fill
        self.to_q, self.to_k, self.to_v, self.to_out = (nn.Linear(d, d) for _ in range(4))
        self.scale = nn.Parameter(torch.tensor(10.0))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.heads, -1).transpose(1, 2) for p in (self.to_q, self.to_k, self.to_v))
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        s = torch.einsum("bhid,bhjd->bhij", q, k) * self.scale
        w = torch.softmax(s.masked_fill(~causal(T), self.fill), -1)
        return self.to_out(torch.einsum("bhij,bhjd->bhid", w, v).transpose(1, 2).reshape(B, T, C))


def test_scores_are_amplified_after_a_functional_q_k_norm():
    torch.manual_seed(0)
    r = examine(L2NormAttention(), causal=True, checks=["eval_dropout", "amplified_logits", "low_precision"], strict=True)
    assert r["amplified_logits"].verdict == "pass" and "after what normalises q and k" in r["amplified_logits"].detail, \
        r["amplified_logits"].detail
    assert r["low_precision"].verdict == "pass", r["low_precision"].detail
    torch.manual_seed(0)
    leaky = examine(L2NormAttention(fill=-1e4), causal=True, checks=["eval_dropout", "amplified_logits"], strict=True)
    assert leaky["amplified_logits"].cause == "masked_key_weight", leaky["amplified_logits"].detail


class TopKAttention(nn.Module):
    """Sparse top-k attention (x-transformers' attn_sparse_topk): each query keeps its k largest
    scores, the rest filled with -finfo.max."""
    def __init__(self, d=16, heads=2, top=4):
        super().__init__()
        self.heads, self.top = heads, top
        self.to_q, self.to_k, self.to_v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.heads, -1).transpose(1, 2) for p in (self.to_q, self.to_k, self.to_v))
        s = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(C // self.heads)
        s = s.masked_fill(~causal(T), -torch.finfo(s.dtype).max)
        kth = s.topk(self.top, dim=-1).values[..., -1:]
        w = s.masked_fill(s < kth, -torch.finfo(s.dtype).max).softmax(-1)
        return x + torch.einsum("bhij,bhjd->bhid", w, v).transpose(1, 2).reshape(B, T, C)


def test_a_mask_that_moves_with_the_scores_is_read_from_the_amplified_call():
    torch.manual_seed(0)
    r = examine(nn.Sequential(TopKAttention(), TopKAttention()), causal=True, checks=["eval_dropout", "amplified_logits"],
                strict=True)   # the second layer's kept keys move when the first's scores are amplified
    assert r["amplified_logits"].verdict == "pass", r["amplified_logits"].detail


class Looped(nn.Module):
    """One attention layer applied twice (x-transformers' looped and weight-tied layers, HRM's
    recurrence): its second call's input depends on its first's output."""
    def __init__(self):
        super().__init__()
        self.attn = InPlaceScaleAttention(d=16, heads=2)

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.attn(x)


def test_a_layer_called_twice_keeps_its_site():
    torch.manual_seed(0)
    r = examine(Looped(), causal=True, checks=["eval_dropout", "score_scale"], strict=True)
    assert r.info["qk_sites"] == 1 and r["score_scale"].verdict == "pass", r["score_scale"].verdict


class Packer(nn.Module):
    """q, k, v out of a projection block whose class does not say attention (ZAYA's CCA projection)."""
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        return tuple(p(x).view(B, T, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))


class PackedAttention(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.qkv, self.out = Packer(d), nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x)
        w = torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~causal(T), float("-inf")), -1)
        return self.out((w @ v).transpose(1, 2).reshape(B, T, C))


def test_the_attention_module_is_the_one_that_calls_the_softmax():
    torch.manual_seed(0)
    r = examine(PackedAttention(), causal=True, checks=["eval_dropout", "self_visibility", "score_scale"], strict=True)
    assert r.info["attention_calls"] == {"softmax": 1} and r.info["qk_sites_measured"] == [""]
    assert r["self_visibility"].verdict == "pass" and r["score_scale"].verdict == "pass", r.table()


@pytest.mark.parametrize("spec", ["FluxIPAdapterJointAttnProcessor2_0,cross", "SD3IPAdapterJointAttnProcessor2_0",
                                  "SD3IPAdapterJointAttnProcessor2_0,cross"])
def test_image_prompt_processors_run_with_the_embeddings_their_recipe_gives(spec):
    """An IP-Adapter's processors take image-prompt tokens (and SD3's a timestep embedding) that an
    image projection hands them; the adapter gives fixed ones, so they run and their image-prompt
    attention is part of the output."""
    df = pytest.importorskip("attention_doctor.diffusers", reason="diffusers is not installed")
    pytest.importorskip("diffusers")
    a = df.build(spec)
    x = torch.randn(2, 8, a.d_model)
    with torch.no_grad():
        y = a.forward(x)
        assert y.shape == x.shape and torch.isfinite(y).all() and torch.equal(a.forward(x), y)
        proc = a.module.processor
        for p in proc.to_v_ip.parameters():   # the image prompt's values reach the output
            p.add_(1.0)
        assert not torch.allclose(a.forward(x), y)
    r = examine(df.build(spec), checks=["eval_dropout", "amplified_logits", "score_scale"], strict=True)
    assert all(c.verdict == "pass" for c in r.checks), r.table()


@pytest.mark.parametrize("opts", ["use_adaptive_layernorm=True", "use_adaptive_layerscale=True", "recycling=True"])
def test_xt_models_that_need_an_argument_at_every_call_get_it(opts):
    """Adaptive norms take a condition at every call (a fixed one here), recycling its recycle_steps."""
    xt = pytest.importorskip("attention_doctor.xtransformers")
    pytest.importorskip("x_transformers")
    a = xt.target(opts)
    x = torch.randint(0, a.vocab_size, (2, 8))
    with torch.no_grad():
        assert torch.equal(a.forward(x), a.forward(x)) and a.forward(x).shape == (2, 8, a.vocab_size)
    r = examine(a, checks=["eval_dropout", "future_leak", "self_visibility"], strict=True)
    assert all(c.verdict == "pass" for c in r.checks), r.table()


class Experts(nn.Module):
    """Projections with their weights stacked (E, out, in), each token through the expert it is
    given (JetMoE's attention experts make q so), to another width than their input's."""
    def __init__(self, d_in, d_out, experts=3):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(experts, d_out, d_in) / math.sqrt(d_in))

    def forward(self, x, pick):
        return torch.einsum("btoi,bti->bto", self.weight[pick], x)


class ExpertQueryAttention(nn.Module):
    def __init__(self, d=16, inner=8):
        super().__init__()
        self.q_experts, self.router = Experts(d, inner), nn.Linear(d, 3)
        self.k_proj, self.v_proj, self.o_proj = nn.Linear(d, inner), nn.Linear(d, inner), nn.Linear(inner, d)

    def forward(self, x):
        T = x.shape[1]
        q, k, v = self.q_experts(x, self.router(x).argmax(-1)), self.k_proj(x), self.v_proj(x)
        w = torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~causal(T), float("-inf")), -1)
        return self.o_proj(w @ v)


def test_q_out_of_a_mixture_of_experts_is_a_site():
    torch.manual_seed(0)
    r = examine(ExpertQueryAttention(), causal=True, checks=["eval_dropout", "score_scale"], strict=True)
    assert r.info["qk_sites_measured"] == [""] and r["score_scale"].verdict == "pass", r.table()


class SoftCapAttention(nn.Module):
    """Scores soft-capped as Gemma 2 caps them: cap * tanh(s / cap); no scaling of q and k takes
    them past the cap."""
    def __init__(self, d=16, heads=2, cap=50.0):
        super().__init__()
        self.heads, self.cap = heads, cap
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        s = self.cap * torch.tanh((q / math.sqrt(C // self.heads)) @ k.transpose(-1, -2) / self.cap)
        w = torch.softmax(s.masked_fill(~causal(T), float("-inf")), -1)
        return self.o_proj((w @ v).transpose(1, 2).reshape(B, T, C))


def test_capped_scores_are_stressed_as_far_as_the_cap():
    torch.manual_seed(0)
    r = examine(SoftCapAttention(), causal=True, checks=["eval_dropout", "amplified_logits", "low_precision"], strict=True)
    amp = r["amplified_logits"]
    assert amp.verdict == "pass" and amp.measurements["capped"] is True, amp.detail
    assert 40 < amp.measurements["largest_score"] <= 50, amp.detail
    assert r["low_precision"].verdict == "pass", r["low_precision"].detail
    torch.manual_seed(0)   # uncapped scores reach the band as before
    r = examine(SoftCapAttention(cap=1e9), causal=True, checks=["eval_dropout", "amplified_logits"], strict=True)
    assert r["amplified_logits"].measurements["capped"] is False
    assert r["amplified_logits"].measurements["largest_score"] >= 1e4, r["amplified_logits"].detail


class ZeroTemperatureAttention(nn.Module):
    """A key temperature initialised to zero (ZAYA's): every score is 0 at init, and no factor on
    q and k moves it."""
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d) for _ in range(4))
        self.temperature = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        s = (q @ k.transpose(-1, -2)) * self.temperature
        w = torch.softmax(s.masked_fill(~causal(T), float("-inf")), -1)
        return self.o_proj((w @ v).transpose(1, 2).reshape(B, T, C))


def test_scores_all_zero_at_init_are_said_so():
    torch.manual_seed(0)
    r = examine(ZeroTemperatureAttention(), causal=True, checks=["eval_dropout", "amplified_logits", "low_precision"],
                strict=True)
    for c in ("amplified_logits", "low_precision"):
        assert r[c].outcome is INCONCLUSIVE and r[c].cause == "scores_zero", (c, r[c].verdict)


class PackedMQA(nn.Module):
    """Multi-query attention as GPT-BigCode's eager path (transformers 4.x) packs it: queries (B, T h, d)
    against the one key (B, d, T) by baddbmm, the scores viewed (B, T, h, T), the weights @ the one value."""
    def __init__(self, d=16, h=4, off_by_one=False):
        super().__init__()
        self.h, self.dh, self.off_by_one = h, d // h, off_by_one
        self.c_attn, self.c_proj = nn.Linear(d, d + 2 * (d // h)), nn.Linear(d, d)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).split((self.h * self.dh, self.dh, self.dh), -1)
        s = torch.baddbmm(q.new_zeros(B, T * self.h, T), q.reshape(B, T * self.h, self.dh), k.transpose(1, 2),
                          beta=1, alpha=self.dh ** -0.5).view(B, T, self.h, T)
        s = torch.where(causal(T, self.off_by_one)[None, :, None, :], s, torch.finfo(s.dtype).min)
        w = F.softmax(s, -1)
        return self.c_proj(torch.bmm(w.view(B, T * self.h, T), v).view(B, T, -1))


@pytest.mark.parametrize("off_by_one", [False, True])
def test_multi_query_packed_queries_outer_heads_inner(off_by_one):
    torch.manual_seed(0)
    r = examine(Layer(PackedMQA(off_by_one=off_by_one), causal=True), checks=["self_visibility", "path_agreement",
                                                                               "low_precision"])
    assert r.info["attention_calls"] == {"softmax": 1}
    assert r["self_visibility"].outcome.value == ("fail" if off_by_one else "pass"), r.table()
    if not off_by_one:   # the call is complete: q, k, v and out, read against the textbook
        assert r["low_precision"].outcome.value == "pass", r.table()


class MappedQK(nn.Module):
    """q and k through a map that is not a multiple of the projections (softplus magnitudes times a
    rotation, as polar embeddings do), then SDPA: the sites are no q/k layout, the calls are plain."""
    def __init__(self, d=16, heads=2, scale=None):
        super().__init__()
        self.heads, self.scale = heads, scale
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = (p(x).view(B, T, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        angle = torch.arange(T)[:, None] * 0.1
        q, k = (F.softplus(t) * torch.cos(angle) for t in (q, k))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, d))


@pytest.mark.parametrize("scale, outcome", [(None, "pass"), (1.0, "fail")])
def test_score_scale_in_the_calls_where_q_k_are_mapped_after_their_projections(scale, outcome):
    torch.manual_seed(0)
    r = examine(Layer(MappedQK(scale=scale), causal=True), checks=["score_scale"])["score_scale"]
    assert r.outcome.value == outcome, (r.reason, r.detail)
