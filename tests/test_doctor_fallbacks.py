"""Fallbacks where a check could not look because of the doctor, not the target: each on a tiny
module of the pattern (seconds)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_doctor import Adapter, examine
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
    the outputs are NaN when the weights are float64 (the reference the doctor starts from)."""
    def __init__(self, index_add=True, nan_in_float64=False):
        super().__init__()
        self.index_add, self.nan_in_float64 = index_add, nan_in_float64
        self.emb, self.expert, self.head = nn.Embedding(V, D), nn.Linear(D, D), nn.Linear(D, V)

    def forward(self, ids, position_ids=None):
        h = self.emb(ids)
        flat = h.reshape(-1, D)
        if self.index_add:
            out = torch.zeros_like(flat)
            out.index_add_(0, torch.arange(flat.shape[0]), self.expert(flat))
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


def test_a_reference_not_finite_in_float64_falls_back_to_float32():
    row = _long_positions(ExpertsLM(index_add=False, nan_in_float64=True))
    assert row.outcome == PASS, row
    assert {b["reference"] for b in row.measurements["bfloat16"]} == {"float32"}, row.measurements
    assert "float64's the reference's outputs: not finite" in row.detail, row.detail
