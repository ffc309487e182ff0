"""Hand-made normalisations (an exp and a sum, or a division by the sum) inside weights that are not
one map as it is, held to what they are: a sink column joined to the scores then dropped, and two
maps subtracted (differential attention, A1 - lambda A2). The probe reads each division that
normalises the scores as a map of its own, so amplified_logits sees them: healthy (softmax) passes;
a naive softmax (no row maximum taken off) beside a sink fails (not finite), and sum-normalised maps
subtracted fail (a map's weights below zero: outside the hull its values allow)."""
import pytest
import torch
import torch.nn as nn

from attention_doctor import examine

V, C, H, D = 64, 32, 2, 16


def _normalised(s, how):
    if how == "naive":
        e = s.exp()
        return e / e.sum(-1, keepdim=True)
    if how == "sum":   # the masked scores (0 there) over their sum
        return s / s.sum(-1, keepdim=True)
    return torch.softmax(s, -1)


class CombinedLM(nn.Module):
    """Causal attention with a sink logit per head (`kind` "sinks") or two maps subtracted
    ("differential"), normalised by `how`: "softmax", "naive" or "sum"."""

    def __init__(self, kind, how="softmax"):
        super().__init__()
        self.kind, self.how = kind, how
        self.emb, self.qkv, self.out, self.head = nn.Embedding(V, C), nn.Linear(C, 3 * H * D), nn.Linear(H * D, C), \
            nn.Linear(C, V)
        self.sink = nn.Parameter(torch.zeros(H))

    def _scores(self, q, k):
        T = q.shape[-2]
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        hidden = torch.ones(T, T, dtype=torch.bool).triu(1)
        return s.masked_fill(hidden, 0.0 if self.how == "sum" else float("-inf"))

    def forward(self, ids):
        x = self.emb(ids)
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
        if self.kind == "sinks":
            s = self._scores(q, k)
            s = torch.cat([s, self.sink.view(1, H, 1, 1).expand(B, H, T, 1)], -1)
            w = _normalised(s, self.how)[..., :T]
        else:
            h = D // 2
            w1 = _normalised(self._scores(q[..., :h], k[..., :h]), self.how)
            w2 = _normalised(self._scores(q[..., h:], k[..., h:]), self.how)
            w = w1 - 0.5 * w2
        y = (w @ v).transpose(1, 2).reshape(B, T, H * D)
        return self.head(x + self.out(y))


def _row(kind, how):
    torch.manual_seed(0)
    r = examine(CombinedLM(kind, how), checks=["amplified_logits"], strict=True)
    return r, r["amplified_logits"]


@pytest.mark.parametrize("kind", ["sinks", "differential"])
def test_healthy_passes(kind):
    r, row = _row(kind, "softmax")
    assert row.outcome.value == "pass", r.details()


@pytest.mark.parametrize("kind, how, cause", [("sinks", "naive", "nonfinite"), ("differential", "sum", "outside_hull")])
def test_bug_fails(kind, how, cause):
    r, row = _row(kind, how)
    assert (row.outcome.value, row.cause) == ("fail", cause), r.details()
