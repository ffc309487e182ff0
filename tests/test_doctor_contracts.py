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
