"""A finite mask fill (masked_fill(-1e4)) replaces the score, so a masked key takes weight only in a row
whose visible scores all fall below the fill. amplified_logits reads the fill from the traced scores and,
where a row's scores reach it with q and k scaled, amplifies past it: the masked keys' weight and the
earlier outputs' move with the later tokens are the witness. finfo.min passes, -1e4 fails."""
import torch
import torch.nn as nn

from attention_doctor import examine

V, C, H, D = 64, 32, 2, 16


class FilledLM(nn.Module):
    """Causal attention whose masked scores are filled with `fill` (replaced, not added)."""

    def __init__(self, fill):
        super().__init__()
        self.fill = fill
        self.emb, self.qkv, self.out, self.head = nn.Embedding(V, C), nn.Linear(C, 3 * H * D), nn.Linear(H * D, C), \
            nn.Linear(C, V)

    def forward(self, ids):
        x = self.emb(ids)
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
        s = (q @ k.transpose(-2, -1)) * D ** -0.5
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), self.fill)
        y = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, H * D)
        return self.head(x + self.out(y))


def _row(fill):
    torch.manual_seed(0)
    r = examine(FilledLM(fill), checks=["amplified_logits"], strict=True)
    return r, r["amplified_logits"]


def test_finfo_min_fill_passes():
    r, row = _row(torch.finfo(torch.float32).min)
    assert row.outcome.value == "pass", r.details()


def test_finite_fill_within_reach_fails_with_a_leak():
    r, row = _row(-1e4)
    assert (row.outcome.value, row.cause) == ("fail", "masked_key_weight"), r.details()
    assert row.measurements["leak"] > 1e-3, r.details()   # the outputs show it
