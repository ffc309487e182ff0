"""Scores an einsum lays out (B, T_q, H, T_k) ('bqhd,bkhd->bqhk') are read in the order the product's
letters give (the queries: the letter only q has; the keys: the one only k has), whatever the
notation's order, so the softmax, or a hand-made exp and sum, of those scores is found with its q and
k: healthy passes amplified_logits and score_scale, a naive softmax (no row maximum taken off) fails
amplified_logits, no 1/sqrt(d) fails score_scale."""
import pytest
import torch
import torch.nn as nn

from attention_doctor import examine

V, C, H, D = 64, 32, 2, 16
CHECKS = ["amplified_logits", "score_scale", "self_visibility"]


class QueriesBeforeHeadsLM(nn.Module):
    """Causal attention with scores (B, T_q, H, T_k). bug: "" healthy, "naive" (exp / sum),
    "no_scale" (no 1/sqrt(d))."""

    def __init__(self, bug=""):
        super().__init__()
        self.bug = bug
        self.emb, self.qkv, self.out, self.head = nn.Embedding(V, C), nn.Linear(C, 3 * H * D), nn.Linear(H * D, C), \
            nn.Linear(C, V)

    def forward(self, ids):
        x = self.emb(ids)
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, H, D).unbind(2)
        scale = 1.0 if self.bug == "no_scale" else D ** -0.5
        s = torch.einsum("bqhd,bkhd->bqhk", q * scale, k)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1)[None, :, None, :], float("-inf"))
        if self.bug == "naive":
            e = s.exp()
            w = e / e.sum(-1, keepdim=True)
        else:
            w = torch.softmax(s, -1)
        y = torch.einsum("bqhk,bkhd->bqhd", w, v).reshape(B, T, H * D)
        return self.head(x + self.out(y))


def _rows(bug):
    torch.manual_seed(0)
    r = examine(QueriesBeforeHeadsLM(bug), checks=CHECKS, strict=True)
    return r, {c: (r[c].outcome.value, r[c].cause) for c in CHECKS}


def test_healthy_passes():
    r, rows = _rows("")
    assert all(o == "pass" for o, _ in rows.values()), r.details()


@pytest.mark.parametrize("bug, check", [("naive", "amplified_logits"), ("no_scale", "score_scale")])
def test_bug_fails(bug, check):
    r, rows = _rows(bug)
    assert rows[check][0] == "fail", r.details()
