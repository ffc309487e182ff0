"""Fallbacks where a check could not look because of the doctor, not the target: each on a tiny
module of the pattern (seconds)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_doctor import Adapter, examine
from attention_doctor.project import ProjectLM
from attention_doctor.result import FAIL, PASS

V, D = 16, 16


class CodebookLM(nn.Module):
    """MusicGen's pattern: the ids come as (B * codebooks, T), each codebook has an embedding of its
    own (a ModuleList, which never runs itself), their outputs are summed; one causal attention.
    `gradient_leak` adds the next position's embedding with value 0 and gradient 1 (a leak the
    outputs cannot show, only the gradient half)."""
    def __init__(self, books=2, gradient_leak=False):
        super().__init__()
        self.books, self.gradient_leak = books, gradient_leak
        self.codebooks = nn.ModuleList(nn.Embedding(V, D) for _ in range(books))
        self.qkv, self.head = nn.Linear(D, 3 * D), nn.Linear(D, V)

    def forward(self, ids):
        T = ids.shape[-1]
        codes = ids.reshape(-1, self.books, T)
        h = sum(emb(codes[:, b]) for b, emb in enumerate(self.codebooks))
        if self.gradient_leak:
            later = h.roll(-1, dims=1)
            h = h + (later - later.detach())
        q, k, v = self.qkv(h).chunk(3, -1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(y).repeat_interleave(self.books, 0)   # one row of logits per row of ids


class CodebookAdapter(Adapter):
    """As transformers' adapter does: the input embedding named is the codebooks' ModuleList."""
    kind, causal = "lm", True

    def __init__(self, lm):
        super().__init__(lm, "codebooks")
        self.vocab_size = V

    def forward(self, x, mask=None, positions=None):
        return self.module(x)

    def embedding(self):
        return self.module.codebooks


def _future_leak(lm):
    torch.manual_seed(0)
    return examine(CodebookAdapter(lm), checks=["eval_dropout", "future_leak"])["future_leak"]


def test_the_gradient_half_takes_the_codebook_embeddings_that_ran_on_the_ids():
    row = _future_leak(CodebookLM())
    assert row.outcome == PASS, row
    assert row.measurements["gradient_max"] == 0.0 and "2 nn.Embedding call(s) on the ids" in row.detail, row


def test_a_gradient_leak_through_the_codebook_embeddings_fails():
    row = _future_leak(CodebookLM(gradient_leak=True))
    assert row.outcome == FAIL and row.cause == "gradient_nonzero", row
    assert max(o["change"] for o in row.measurements["outputs"]) == 0.0   # only the gradient shows it


class ExpertsLM(nn.Module):
    """Outputs that do not depend on the position ids, through one expert whose output is added
    into a buffer of the hidden states' dtype with index_add_ (DBRX's experts, X-MOD's adapters):
    in bfloat16 weights it runs, under bfloat16 autocast the buffer stays float32 and the expert's
    output is bfloat16, so it raises (as the model does for a user under autocast). `nan_in_float64`:
    the outputs are NaN when the weights are float64 (the reference the doctor starts from).
    `into_state`: the expert's output is added into a buffer the module keeps (gpt-fast's KVCache,
    set up in the weights' dtype), not into a tensor the forward makes."""
    def __init__(self, index_add=True, nan_in_float64=False, into_state=False):
        super().__init__()
        self.index_add, self.nan_in_float64, self.into_state = index_add, nan_in_float64, into_state
        self.emb, self.expert, self.head = nn.Embedding(V, D), nn.Linear(D, D), nn.Linear(D, V)
        self.register_buffer("acc", torch.zeros(4096, D))

    def forward(self, ids, position_ids=None):
        h = self.emb(ids)
        flat = h.reshape(-1, D)
        if self.index_add:
            out = self.acc[:flat.shape[0]].zero_() if self.into_state else torch.zeros_like(flat)
            out.index_add_(0, torch.arange(flat.shape[0]), self.expert(flat))
            out = out.clone()
        else:
            out = self.expert(flat)
        y = self.head(torch.tanh(out.reshape(h.shape)))
        if self.nan_in_float64 and y.dtype == torch.float64:
            y = y * float("nan")
        return y


def _long_positions(lm):
    torch.manual_seed(0)
    return examine(lm, checks=["eval_dropout", "long_positions"])["long_positions"]


def test_raising_under_bfloat16_autocast_fails_long_positions_as_low_precision_does():
    row = _long_positions(ExpertsLM())
    assert row.outcome == FAIL and row.cause == "raised_in_low_precision", row
    by_mode = {b["mode"]: b for b in row.measurements["bfloat16"]}
    assert by_mode["weights"]["error_0"] is not None and "raised" not in by_mode["weights"], by_mode
    assert "index_add_" in by_mode["autocast"]["raised"] and by_mode["autocast"]["error_0"] is None, by_mode
    healthy = _long_positions(ExpertsLM(index_add=False))   # the same without the dtype clash: it holds
    assert healthy.outcome == PASS, healthy


def test_autocast_raising_on_a_write_into_the_targets_own_state_is_its_limit_not_a_fail():
    """gpt-fast's KVCache: a buffer set up in the weights' dtype takes no bfloat16 write under
    autocast. Both precision checks run the weights half and leave the autocast half inconclusive
    naming the buffer; the same write into a tensor the forward made (DBRX's) fails, above."""
    torch.manual_seed(0)
    lm = ExpertsLM(into_state=True)
    r = examine(lm, checks=["eval_dropout", "low_precision", "long_positions"])
    assert r["long_positions"].cause == "part_not_run", r["long_positions"]
    for name in ("low_precision", "long_positions"):   # low_precision also misses the scores of a model without attention
        row = r[name]
        assert row.outcome == "inconclusive", row
        assert "`acc` is float32 and takes no bfloat16 write under autocast" in row.reason, row.reason
    assert r["low_precision"].measurements["nonfinite_runs"] == [], r["low_precision"].measurements
    assert {"bfloat16 autocast", "float16 autocast"} <= set(r["low_precision"].measurements["not_run"])
    by_mode = {b["mode"]: b for b in r["long_positions"].measurements["bfloat16"]}
    assert set(by_mode) == {"weights"} and by_mode["weights"]["error_0"] is not None, by_mode


def test_a_reference_not_finite_in_float64_falls_back_to_float32():
    row = _long_positions(ExpertsLM(index_add=False, nan_in_float64=True))
    assert row.outcome == PASS, row
    assert {b["reference"] for b in row.measurements["bfloat16"]} == {"float32"}, row.measurements
    assert "float64's the reference's outputs: not finite" in row.detail, row.detail


class NormedQK(nn.Module):
    """Llama 4's pattern: q and k projected, then a weightless RMS norm whose eps is not small
    beside their mean square (projections initialised at std 0.02), so scaling the projections
    neither scales q k^T nor leaves it as it was; then scaled dot-product attention, by SDPA or by
    hand (`eager`). `scale`: the scores' factor (1/sqrt(d) healthy, 1 the missing scale)."""
    def __init__(self, d=64, heads=4, eager=False, scale=None):
        super().__init__()
        self.h, self.dh, self.eager = heads, d // heads, eager
        self.scale = self.dh ** -0.5 if scale is None else scale
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d, bias=False) for _ in range(4))
        for p in (self.q_proj, self.k_proj):
            nn.init.normal_(p.weight, std=0.02)

    def _heads(self, t):
        B, T, _ = t.shape
        return t.view(B, T, self.h, self.dh).transpose(1, 2)

    @staticmethod
    def _norm(t, eps=1e-3):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps)

    def forward(self, x):
        q, k = (self._norm(self._heads(p(x))) for p in (self.q_proj, self.k_proj))
        v = self._heads(self.v_proj(x))
        if self.eager:
            s = (q @ k.transpose(-2, -1)) * self.scale
            s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
            y = torch.softmax(s, -1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return self.o_proj(y.transpose(1, 2).flatten(2))


@pytest.mark.parametrize("eager", [False, True])
def test_score_scale_is_measured_inside_the_calls_where_q_and_k_are_normalised_after_the_sites(eager):
    torch.manual_seed(0)
    r = examine(NormedQK(eager=eager), causal=True, checks=["score_scale"])
    row = r["score_scale"]
    assert r.info.get("qk_sites_rejected"), r.info   # the pattern: no site scales q k^T
    assert row.outcome == PASS and "as the attention calls get them" in row.detail, row
    torch.manual_seed(0)
    row = examine(NormedQK(eager=eager, scale=1.0), causal=True, checks=["score_scale"])["score_scale"]
    assert row.outcome == FAIL and row.cause == "too_large", row   # std ~ sqrt(16)


class OffsetInPlace(ProjectLM):
    """XGLM's pattern in transformers 4.x: the forward adds its offset to the caller's position ids in
    place (`position_ids += self.offset`): a view that shares one row between the batch raises there."""

    def forward(self, x, mask=None, positions=None):
        if positions is not None:
            positions += 2          # the target's offset, written into what it was given
            positions = positions - 2
        return super().forward(x, mask, positions)


def test_positions_given_in_their_own_memory_take_an_in_place_offset():
    from attention.lm import ModelConfig, TransformerLM
    torch.manual_seed(0)
    lm = TransformerLM(ModelConfig(vocab_size=V, block_size=32, d_model=32, n_layers=2, n_heads=2, pos="rope")).eval()
    row = examine(OffsetInPlace(lm), checks=["eval_dropout", "long_positions"])["long_positions"]
    assert row.outcome == PASS, row


class ZeroTemperatureLM(nn.Module):
    """ZAYA's pattern: q and k L2-normalised, the keys times a learned per-head temperature, 0 at init."""
    def __init__(self, temp=0.0, heads=2):
        super().__init__()
        self.h = heads
        self.emb, self.head = nn.Embedding(V, 2 * D), nn.Linear(2 * D, V)
        self.q, self.k, self.v = (nn.Linear(2 * D, 2 * D) for _ in range(3))
        self.temp = nn.Parameter(torch.full((heads,), temp))

    def forward(self, ids):
        x = self.emb(ids)
        B, T, _ = x.shape
        q, k, v = (m(x).view(B, T, self.h, -1).transpose(1, 2) for m in (self.q, self.k, self.v))
        q = q * (q.shape[-1] ** 0.5 / q.norm(dim=-1, keepdim=True))
        k = k * (k.shape[-1] ** 0.5 / k.norm(dim=-1, keepdim=True)) * self.temp[None, :, None, None]
        s = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        return self.head(x + (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1))


class Plain(Adapter):
    kind, causal = "lm", True

    def __init__(self, lm):
        super().__init__(lm, "plain")
        self.vocab_size = V

    def forward(self, x, mask=None, positions=None):
        return self.module(x)


@pytest.mark.parametrize("temp, outcome, cause", [(0.0, "inconclusive", "scores_zero"), (1.0, "pass", "")])
def test_scores_zero_at_init_are_the_targets_not_a_missing_layout(temp, outcome, cause):
    torch.manual_seed(0)
    row = examine(Plain(ZeroTemperatureLM(temp).eval()), checks=["eval_dropout", "score_scale"])["score_scale"]
    assert row.outcome.value == outcome and row.cause == cause, row
