"""lucidrains' manner with einops (x-transformers, the *-pytorch repositories): `to_qkv` chunked
in three, `rearrange(t, 'b n (h d) -> b h n d')`, q scaled first, `torch.matmul` for the scores and
the output, a bool keep `mask` rearranged to 'b 1 1 j' and a causal `triu(j - i + 1)` both filled
with `-torch.finfo(dtype).max`, `sim.softmax(dim=-1)`, `rearrange(out, 'b h n d -> b n (h d)')`;
rotary positions 0..n-1 (relative: left padding moves nothing).

Interface: `forward(x, mask=None)` on a `TransformerWrapper`; `mask` (B, T) bool, True = keep. No cache."""
import torch
import torch.nn as nn
from einops import rearrange

from doctor_lab.styles._common import (
    HEAD_DIM,
    HEADS,
    LAYERS,
    VOCAB,
    D,
    built,
    causal_keep,
    factories,
    fill,
    normalise,
    rope_cos_sin,
    rotate,
    scale,
)

PLANTED = {
    "no_scaling": "q not multiplied by self.scale",
    "off_by_one": "the causal mask triu(j - i): the diagonal masked too",
    "sees_next": "the causal mask triu(j - i + 2)",
    "mask_ignored": "mask taken and never applied",
    "softmax_over_queries": "sim.softmax(dim=-2)",
    "naive_softmax": "sim.exp() / its sum, no max subtracted",
    "sum_normalize": "sim / its sum, the masked ones set to 0",
    "no_transpose_merge": "out.reshape(b, n, h d) in place of rearrange('b h n d -> b n (h d)')",
    "neg_inf_fill": "mask_value = -inf: a left-padded row with no visible key is NaN",
}
NO_CACHE = "no KV cache here (lucidrains' cache is x-transformers', the classic einsum style's)"
CANNOT = {"cache_top_left": NO_CACHE, "cache_off_by_one": NO_CACHE, "cache_positions_from_zero": NO_CACHE}


class Attention(nn.Module):
    def __init__(self, bug, dim=D, heads=HEADS, dim_head=HEAD_DIM):
        super().__init__()
        self.bug, self.heads, self.scale = bug, heads, scale(dim_head, bug)
        self.to_qkv = nn.Linear(dim, heads * dim_head * 3, bias=False)
        self.to_out = nn.Linear(heads * dim_head, dim)

    def forward(self, x, mask=None, rotary=None):
        q, k, v = (rearrange(t, "b n (h d) -> b h n d", h=self.heads) for t in self.to_qkv(x).chunk(3, dim=-1))
        q, k = rotate(q, *rotary), rotate(k, *rotary)
        sim = torch.matmul(q * self.scale, k.transpose(-1, -2))
        mask_value = fill(self.bug, sim.dtype)
        i, j = sim.shape[-2:]
        hidden = ~causal_keep(i, j, self.bug, x.device)
        if mask is not None and self.bug != "mask_ignored":
            hidden = hidden | ~rearrange(mask, "b j -> b 1 1 j")
        attn = normalise(sim.masked_fill(hidden, mask_value), self.bug, fill_zero=hidden)
        out = torch.matmul(attn, v)
        b, h, n, d = out.shape
        out = out.reshape(b, n, h * d) if self.bug == "no_transpose_merge" else rearrange(out, "b h n d -> b n (h d)")
        return self.to_out(out)


class Decoder(nn.Module):
    def __init__(self, bug):
        super().__init__()
        self.layers = nn.ModuleList(nn.ModuleList([nn.LayerNorm(D), Attention(bug), nn.LayerNorm(D),
                                                   nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))])
                                    for _ in range(LAYERS))
        self.final_norm = nn.LayerNorm(D)

    def forward(self, x, mask=None):
        rotary = rope_cos_sin(torch.arange(x.shape[1], device=x.device), HEAD_DIM)
        for attn_norm, attn, ff_norm, ff in self.layers:
            x = x + attn(attn_norm(x), mask=mask, rotary=rotary)
            x = x + ff(ff_norm(x))
        return self.final_norm(x)


class TransformerWrapper(nn.Module):
    def __init__(self, bug=None):
        super().__init__()
        self.token_emb = nn.Embedding(VOCAB, D)
        self.attn_layers = Decoder(bug)
        self.to_logits = nn.Linear(D, VOCAB)

    def forward(self, x, mask=None):
        return self.to_logits(self.attn_layers(self.token_emb(x), mask=mask))


def build(bug=None, seed=0):
    return built(TransformerWrapper, bug, PLANTED, seed)


def padded(model, ids, keep):
    return model(ids, mask=keep)


__getattr__ = factories(build, PLANTED)
