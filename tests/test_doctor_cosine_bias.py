"""score_scale where q and k are normalised after their projections and a bias is added to the
scores (cosine attention beside ALiBi): scaling the projections moves nothing, so the q . k part is
measured by scaling q and k as the call takes them (the bias does not move); the bias's spread is
never read as the scores' scale. Cosine without a temperature fails too_small; a q/k norm (rms 1)
with 1/sqrt(d) passes."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_doctor import examine

V, C, H, D = 64, 32, 2, 16


class NormedAlibi(nn.Module):
    """Causal attention, ALiBi slopes 1/2 and 1/4; `norm`: "cosine" (unit q and k, no temperature)
    or "rms" (q and k of rms 1, then 1/sqrt(d))."""

    def __init__(self, norm):
        super().__init__()
        self.norm = norm
        self.emb, self.qkv, self.out, self.head = (nn.Embedding(V, C), nn.Linear(C, 3 * H * D), nn.Linear(H * D, C),
                                                   nn.Linear(C, V))

    def forward(self, ids):
        x = self.emb(ids)
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        if self.norm == "cosine":
            q, k, scale = F.normalize(q, dim=-1), F.normalize(k, dim=-1), 1.0
        else:
            q, k, scale = F.rms_norm(q, (D,)), F.rms_norm(k, (D,)), D ** -0.5
        i = torch.arange(T)
        bias = -torch.tensor([0.5, 0.25])[:, None, None] * (i[:, None] - i[None, :]).clamp_min(0)
        s = q @ k.transpose(-2, -1) * scale + bias
        w = torch.softmax(s.masked_fill(i[None, :] > i[:, None], float("-inf")), -1)
        y = (w @ v).transpose(1, 2).reshape(B, T, H * D)
        return self.head(x + self.out(y))


def test_cosine_scores_beside_alibi_are_read_without_the_bias():
    torch.manual_seed(0)
    row = examine(NormedAlibi("cosine"), checks=["score_scale"])["score_scale"]
    assert row.failed and row.cause == "too_small", row.detail
    assert abs(row.measured - D ** -0.5) < 0.1, row.detail   # unit vectors: q . k has std 1/sqrt(d)
    normed = examine(NormedAlibi("rms"), checks=["score_scale"])["score_scale"]
    assert not normed.failed and 0.7 < normed.measured < 1.4, normed.detail
