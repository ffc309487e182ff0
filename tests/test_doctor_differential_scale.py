"""Differential attention's two softmax maps read their q and k off different columns of the same
projections: the scale check makes q and k unit-variance over every column the module's calls take
(a site found on the first map alone left the second map's q and k at their raw size, and a healthy
model read as too_small). Healthy passes score_scale; the maps without 1/sqrt(d) still fail."""
import torch
import torch.nn as nn

from attention_doctor import examine

V, C, H, D = 64, 32, 2, 8


class TwoMaps(nn.Module):
    """A1 - 0.5 A2 with q1|k1 and q2|k2 columns of one q and one k projection, each map scaled by
    `scale` (a projection's raw outputs are far from unit variance: rms about 0.6 at init)."""

    def __init__(self, scale=D ** -0.5):
        super().__init__()
        self.scale = scale
        self.emb, self.q, self.k, self.v = (nn.Embedding(V, C), nn.Linear(C, 2 * H * D), nn.Linear(C, 2 * H * D),
                                            nn.Linear(C, H * D))
        self.out, self.head = nn.Linear(H * D, C), nn.Linear(C, V)

    def forward(self, ids):
        x = self.emb(ids)
        B, T, _ = x.shape
        q1, q2 = (t.reshape(B, T, H, D).transpose(1, 2) for t in self.q(x).chunk(2, -1))
        k1, k2 = (t.reshape(B, T, H, D).transpose(1, 2) for t in self.k(x).chunk(2, -1))
        v = self.v(x).view(B, T, H, D).transpose(1, 2)
        hidden = torch.ones(T, T, dtype=torch.bool).triu(1)
        a1 = torch.softmax((q1 @ k1.transpose(-2, -1) * self.scale).masked_fill(hidden, float("-inf")), -1)
        a2 = torch.softmax((q2 @ k2.transpose(-2, -1) * self.scale).masked_fill(hidden, float("-inf")), -1)
        y = ((a1 - 0.5 * a2) @ v).transpose(1, 2).reshape(B, T, H * D)
        return self.head(x + self.out(y))


def test_both_maps_of_differential_attention_are_read_at_unit_variance():
    torch.manual_seed(0)
    r = examine(TwoMaps(), checks=["score_scale"])
    row = r["score_scale"]
    assert not row.failed, r.details()
    stds = row.measurements["stds"]
    assert len(stds) == 2 and all(0.5 < s < 2 for s in stds), stds
    unscaled = examine(TwoMaps(scale=1.0), checks=["score_scale"])["score_scale"]
    assert unscaled.failed and unscaled.cause == "too_large", unscaled.reason
