"""eval_dropout tells dropout from floating-point reordering by measurement, not by bit equality:
two eval calls that differ by a few ulps of the outputs' scale (sums taken in another order, as a
busy machine's kernels may) pass, and the comparisons after it are held no tighter than that noise;
dropout left on in eval (entries zeroed, survivors rescaled) and noise beyond rounding fail."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_doctor import examine

V, C = 64, 32
CHECKS = ["eval_dropout", "future_leak", "batch_independence"]


class NoisyLM(nn.Module):
    """A one-head causal LM. mode: "dropout" (dropout p=0.1 on the weights, left on in eval),
    "random_order" (the weights @ v summed over the keys in another order each call),
    "ulps" (each call's logits moved by -16, 0 or +16 ulps of their scale in turn),
    "noise" (Gaussian noise of 1e-3 of the scale: random, beyond rounding, nothing zeroed)."""

    def __init__(self, mode=""):
        super().__init__()
        self.mode, self.calls = mode, 0
        self.emb, self.qkv, self.out, self.head = (nn.Embedding(V, C), nn.Linear(C, 3 * C), nn.Linear(C, C),
                                                   nn.Linear(C, V))

    def forward(self, ids):
        self.calls += 1
        g = torch.Generator().manual_seed(self.calls)   # deterministic: the n-th call's order or noise
        x = self.emb(ids)
        T = x.shape[1]
        q, k, v = self.qkv(x).chunk(3, -1)
        s = (q @ k.transpose(-2, -1) / C ** 0.5).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        w = torch.softmax(s, -1)
        if self.mode == "dropout":
            w = F.dropout(w, 0.1, training=True)
        if self.mode == "random_order":
            y = torch.zeros_like(v)
            for j in torch.randperm(T, generator=g).tolist():
                y = y + w[..., j:j + 1] * v[:, j:j + 1]
        else:
            y = w @ v
        logits = self.head(x + self.out(y))
        if self.mode == "ulps":
            shift = self.calls % 3 - 1   # -1, 0 or 1: any two calls not 3 apart differ
            logits = logits + shift * 16 * torch.finfo(logits.dtype).eps * logits.detach().abs().max()
        if self.mode == "noise":
            logits = logits + 1e-3 * logits.detach().abs().max() * torch.randn(logits.shape, generator=g)
        return logits


def _examined(mode):
    torch.manual_seed(0)
    return examine(NoisyLM(mode), checks=CHECKS, strict=True)


def test_dropout_left_on_in_eval_fails():
    r = _examined("dropout")
    row = r["eval_dropout"]
    assert row.failed and row.cause == "random_in_eval", r.details()
    assert row.measurements["relative"] > 1e-2 and row.measurements["moved_share"] > 0.05, row.measurements
    assert r["future_leak"].cause == "not_repeatable"


def test_reordered_sums_pass_and_the_checks_run():
    r = _examined("random_order")
    row = r["eval_dropout"]
    assert row.outcome == "pass", r.details()
    assert 0 < row.measurements["relative"] < 1e-6, row.measurements   # the calls do differ, by ulps
    assert row.measurements["moved_share"] == 0.0
    assert r["future_leak"].outcome == "pass" and r["batch_independence"].outcome == "pass", r.details()


def test_ulp_noise_raises_the_comparisons_limits():
    r = _examined("ulps")
    row = r["eval_dropout"]
    assert row.outcome == "pass", r.details()
    noise = row.measurements["relative"]
    assert 1e-6 < noise < 7.6e-6, noise   # above future_leak's 1e-6: held to 4x the noise instead
    leak = r["future_leak"]
    assert leak.outcome == "pass" and leak.measurements["limit"] >= 4 * noise, r.details()
    assert max(o["change"] for o in leak.measurements["outputs"]) > 1e-6   # the noise reached the comparison


def test_noise_beyond_rounding_fails():
    r = _examined("noise")
    row = r["eval_dropout"]
    assert row.failed and row.cause == "random_in_eval", r.details()
    assert row.measurements["relative"] > 1e-4 and row.measurements["zeroed_share"] == 0.0


class NoisyLayer(nn.Module):
    """A causal layer whose causality no attention mask shows (a running mean: found from its
    outputs) and whose outputs move by -16, 0 or +16 ulps of their scale from call to call."""

    def __init__(self):
        super().__init__()
        self.calls, self.inp, self.out = 0, nn.Linear(C, C), nn.Linear(C, C)

    def forward(self, x):
        self.calls += 1
        h = self.inp(x)
        y = self.out(h.cumsum(1) / torch.arange(1, x.shape[1] + 1, dtype=h.dtype)[:, None])
        return y + (self.calls % 3 - 1) * 16 * torch.finfo(y.dtype).eps * y.detach().abs().max()


def test_causality_is_found_within_the_noise():
    torch.manual_seed(0)
    r = examine(NoisyLayer(), checks=["eval_dropout", "future_leak"], strict=True)
    assert r["eval_dropout"].outcome == "pass" and r["eval_dropout"].measurements["relative"] > 0, r.details()
    assert r.info["description"]["causal"] is True and r["future_leak"].outcome == "pass", r.details()
