"""A maintainer's small causal LM (the worked example of docs/doctor.md): token and position
embeddings, one attention block, a padding mask. Masked scores are filled with -inf, so a query
with no real key (a left pad) gets NaN, and its gradients too (`fill="min"`: the dtype's
minimum, finite). `build(bug=...)` plants a regression for the example's second run:
"sees_next" lets each token see the next one."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyLM(nn.Module):
    def __init__(self, vocab=64, d=32, heads=2, max_len=64, bug=None, fill="-inf"):
        super().__init__()
        self.heads, self.bug, self.fill = heads, bug, fill
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.head = nn.Linear(d, vocab)

    def forward(self, ids, attention_mask=None):
        B, T = ids.shape
        x = self.tok(ids) + self.pos(torch.arange(T, device=ids.device))
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        scores = (q / q.shape[-1] ** 0.5) @ k.transpose(-2, -1)   # scaled first: no float16 overflow
        keep = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril(1 if self.bug == "sees_next" else 0)
        if attention_mask is not None:   # 1 = a real token, 0 = padding
            keep = keep & attention_mask.bool()[:, None, None, :]
        fill = float("-inf") if self.fill == "-inf" else torch.finfo(scores.dtype).min
        scores = scores.masked_fill(~keep, fill)   # -inf: a row with no real key is NaN (the baseline says so)
        y = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, -1)
        x = x + self.proj(y)
        return self.head(x + self.mlp(x))


def build(bug=None, fill="-inf"):
    torch.manual_seed(0)
    return TinyLM(bug=bug, fill=fill)
