"""A flex_attention score_mod that masks with a finite fill (torch.where(keep, score, finfo.min), as
code written for half precision does) hides those keys as -inf does: the probe reads them as masked
(an entry that does not move with the score and lies below MASKED), not as visible scores of -3e38
whose bfloat16 rounding is read as a non-finite error. A soft-cap saturated far out still moves
nothing, but stays high: visible."""
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.attention.flex_attention as fa_module
from torch.nn.attention.flex_attention import flex_attention

from attention_doctor import examine
from attention_doctor.probes import Probe

C, HEADS, V = 16, 2, 32


@pytest.fixture(autouse=True)
def eager_flex(monkeypatch):
    monkeypatch.setattr(fa_module, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def test_a_finite_fill_of_a_score_mod_is_read_as_masked():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    fill = torch.finfo(q.dtype).min

    def causal_fill(score, b, h, q_idx, kv_idx):
        return torch.where(q_idx >= kv_idx, score, fill)

    def softcap(score, b, h, q_idx, kv_idx):   # saturates: 1e4 x the scores leaves +-5, unmoved by +1
        return 5 * torch.tanh(score * 1e4 / 5)
    with Probe() as p:
        flex_attention(q, k, v, score_mod=causal_fill)
        flex_attention(q, k, v, score_mod=softcap)
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    assert torch.equal(p.calls[0].visible, causal.expand(1, 2, 8, 8))
    assert bool(p.calls[1].visible.all())


class FillLM(nn.Module):
    """One causal flex call masked by a score_mod's fill (finfo.min of the compute dtype), rotary
    positions, and Meta's cache: kept inside, written at start_pos (slots never written: zeros)."""

    def __init__(self):
        super().__init__()
        self.emb, self.c_attn, self.proj, self.head = (nn.Embedding(V, C), nn.Linear(C, 3 * C), nn.Linear(C, C),
                                                       nn.Linear(C, V))
        self.kv = None

    def forward(self, tokens, start_pos=0):
        B, T = tokens.shape
        x = self.emb(tokens)
        q, k, v = self.c_attn(x).view(B, T, 3, HEADS, C // HEADS).permute(2, 0, 3, 1, 4)
        d = C // HEADS
        ang = torch.arange(start_pos, start_pos + T)[:, None] * 10000 ** (-torch.arange(0, d, 2) / d)
        cos, sin = ang.cos().to(q.dtype), ang.sin().to(q.dtype)

        def rot(t):
            a, b = t[..., : d // 2], t[..., d // 2:]
            return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)
        q, k = rot(q), rot(k)
        if start_pos == 0 or self.kv is None or self.kv[0].shape[0] != B:
            self.kv = (k.new_zeros(B, HEADS, 0, d), v.new_zeros(B, HEADS, 0, d))
        past = [torch.cat([t.to(k.dtype), t.new_zeros(B, HEADS, start_pos - t.shape[2], d).to(k.dtype)], 2)[:, :, :start_pos]
                for t in self.kv]
        k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        self.kv = (k.detach(), v.detach())
        fill = torch.finfo(q.dtype).min

        def causal_fill(score, b, h, q_idx, kv_idx):
            return torch.where(q_idx + start_pos >= kv_idx, score, fill)
        y = flex_attention(q, k, v, score_mod=causal_fill)
        return self.head(x + self.proj(y.transpose(1, 2).reshape(B, T, C)))


def test_a_healthy_flex_lm_with_a_finite_fill_passes_long_positions_through_its_cache():
    torch.manual_seed(0)
    r = examine(FillLM(), checks=["eval_dropout", "long_positions"])
    row = r["long_positions"]
    assert row.measurements.get("through_cache"), r.details()
    assert row.outcome == "pass", r.details()
