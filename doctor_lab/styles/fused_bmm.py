"""Fused-qkv batched matmuls, the manner of many from-scratch GPTs: one `Linear(d, 3d)` chunked
into q, k, v, heads folded into the batch ([B h, T, d]), `torch.bmm(q * scale, k^T)`, the causal
and padding keep-masks filled with the scores' dtype's lowest (`masked_fill`), a softmax,
`torch.bmm` with v; learned absolute positions counted from each row's first real token.

Interface: `forward(idx, mask=None)`; `mask` (B, T) bool, True = a real token. No cache."""
import torch
import torch.nn as nn

from doctor_lab.styles._common import (
    HEAD_DIM,
    HEADS,
    LAYERS,
    MAX_POS,
    VOCAB,
    D,
    built,
    causal_keep,
    factories,
    fill,
    first_real,
    merge,
    normalise,
    scale,
)

PLANTED = {
    "no_scaling": "q not multiplied by the scale",
    "off_by_one": "the causal keep-mask tril(diagonal=-1)",
    "sees_next": "the causal keep-mask tril(diagonal=1)",
    "mask_ignored": "mask taken and not applied",
    "softmax_over_queries": "softmax(dim=-2)",
    "naive_softmax": "exp / sum without the max subtracted",
    "sum_normalize": "scores / their sum, the masked ones set to 0",
    "no_transpose_merge": "y.view(B, h, T, d).reshape(B, T, C) without the transpose",
    "neg_inf_fill": "masked_fill with -inf: a left-padded row with no visible key is NaN",
}
NO_CACHE = "no KV cache: a training-time module (forward(idx, mask) only)"
CANNOT = {"cache_top_left": NO_CACHE, "cache_off_by_one": NO_CACHE, "cache_positions_from_zero": NO_CACHE}
# the mask still sets the positions (first_real): honoured there, ignored by the attention, so no
# encoding is inert and the doctor names the side that moves
EXPECTS = {"mask_ignored": (("padding", "left_padding"),)}


class Attention(nn.Module):
    def __init__(self, bug):
        super().__init__()
        self.bug = bug
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x, keep=None):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, HEADS, HEAD_DIM).transpose(1, 2).reshape(B * HEADS, T, HEAD_DIM)
                   for t in self.qkv(x).chunk(3, -1))
        allowed = causal_keep(T, T, self.bug, x.device)[None]
        if keep is not None and self.bug != "mask_ignored":
            allowed = allowed & keep.repeat_interleave(HEADS, 0)[:, None, :]
        hidden = ~allowed.expand(B * HEADS, T, T)
        att = torch.bmm(q * scale(HEAD_DIM, self.bug), k.transpose(1, 2))
        att = att.masked_fill(hidden, fill(self.bug, att.dtype))   # filled in the scores' own dtype
        y = torch.bmm(normalise(att, self.bug, fill_zero=hidden), v)
        return self.proj(merge(y.view(B, HEADS, T, HEAD_DIM), self.bug))


class Block(nn.Module):
    def __init__(self, bug):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(D), Attention(bug), nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x, keep=None):
        x = x + self.attn(self.ln_1(x), keep)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, bug=None):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(MAX_POS, D)
        self.blocks = nn.ModuleList(Block(bug) for _ in range(LAYERS))
        self.ln_f, self.lm_head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx, mask=None):
        keep = None if mask is None else mask.bool()
        x = self.wte(idx) + self.wpe(first_real(keep, idx.shape[1], idx.device))
        for block in self.blocks:
            x = block(x, keep)
        return self.lm_head(self.ln_f(x))


def build(bug=None, seed=0):
    return built(GPT, bug, PLANTED, seed)


def padded(model, ids, keep):
    return model(ids, mask=keep)


__getattr__ = factories(build, PLANTED)
