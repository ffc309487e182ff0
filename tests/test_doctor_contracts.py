"""A precision the target refuses by its own assertion is its contract (nanochat asserts its rotary
buffers are in its compute dtype): low_precision is inconclusive there, saying so, never a fail; a
forward that raises an error of its computation in float16 still fails."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_doctor import examine

V, C, H = 64, 32, 4


class AssertingLM(nn.Module):
    """A causal LM that asserts its weights are float32 (`assertion`), or fails in half precision
    with an error of its own computation (a RuntimeError)."""

    def __init__(self, assertion=True):
        super().__init__()
        self.assertion = assertion
        self.emb, self.qkv, self.head = nn.Embedding(V, C), nn.Linear(C, 3 * C), nn.Linear(C, V)

    def forward(self, ids):
        x = self.emb(ids)
        if x.dtype != torch.float32:
            if self.assertion:
                assert x.dtype == torch.float32, "runs in float32; bfloat16 through its autocast"
            raise RuntimeError(f"expected scalar type Float but found {x.dtype}")
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, H, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(x + y.transpose(1, 2).reshape(B, T, C))


def test_an_asserted_precision_is_the_targets_contract_not_a_fail():
    torch.manual_seed(0)
    r = examine(AssertingLM(), checks=["eval_dropout", "low_precision"])["low_precision"]
    assert r.inconclusive and r.cause == "part_not_run", r.verdict + " " + r.detail
    assert "asserts against running so" in r.detail
    raised = examine(AssertingLM(assertion=False), checks=["eval_dropout", "low_precision"])["low_precision"]
    assert raised.failed and raised.cause == "raised_in_low_precision", raised.detail


class SdpaMaskLM(nn.Module):
    """lingua's manner: forward(ids, mask=None), the mask handed to SDPA as attn_mask unchanged (the
    caller passes a broadcast-ready mask; a (B, T) one broadcasts at B = 1 only)."""

    def __init__(self):
        super().__init__()
        self.emb, self.qkv, self.head = nn.Embedding(V, C), nn.Linear(C, 3 * C), nn.Linear(C, V)

    def forward(self, ids, mask=None):
        x = self.emb(ids)
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, H, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal if mask is None else mask & causal)
        return self.head(x + y.transpose(1, 2).reshape(B, T, C))


def test_the_mask_encoding_is_chosen_on_a_batch_not_one_row():
    torch.manual_seed(0)
    r = examine(SdpaMaskLM(), checks=["eval_dropout", "batch_independence", "padding", "fully_masked_rows"])
    assert "B, 1" in r.info["conventions"]["mask"], r.info["conventions"]   # a shape that masks a batch
    assert not r.failed, r.table()
    for c in ("batch_independence", "padding"):   # (B, T) masks one row only: said, not failed
        assert r[c].outcome.value == "warn" and r[c].cause == "mask_shape_batch_only", r[c].detail
