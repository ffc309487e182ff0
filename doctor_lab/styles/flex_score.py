"""FlexAttention through a `score_mod` (torch.nn.attention.flex_attention; the FlexAttention blog's
causal example): one score_mod that keeps a score where `q_idx >= kv_idx` and the key is a real
token (`keep[b, kv_idx]`, a tensor it captures) and gives -inf elsewhere; a fused `c_attn`; half-
rotation rotary positions. On CPU (torch 2.13) flex_attention runs forward only: a backward
raises NotImplementedError, as it does for anyone who writes this.

Interface: `forward(idx, attention_mask=None)`; `attention_mask` (B, T), 1 = a real token. No cache."""
import torch
import torch.nn as nn
from torch.nn.attention.flex_attention import flex_attention

from doctor_lab.styles._common import (
    HEAD_DIM,
    HEADS,
    LAYERS,
    VOCAB,
    D,
    RMSNorm,
    TransformerBlock,
    built,
    factories,
    merge,
    rope_cos_sin,
    rotate,
    scale,
)

PLANTED = {
    "no_scaling": "flex_attention(..., scale=1.0)",
    "off_by_one": "score_mod keeps q_idx > kv_idx",
    "sees_next": "score_mod keeps q_idx + 1 >= kv_idx",
    "mask_ignored": "attention_mask taken and not captured by the score_mod",
    "no_transpose_merge": "y.reshape(B, T, C) without y.transpose(1, 2)",
}
FLEX = "flex_attention computes the softmax: no softmax of its own to get wrong"
NO_CACHE = "no KV cache in the score_mod variant (the flex_mask style has one)"
CANNOT = {
    "softmax_over_queries": FLEX, "naive_softmax": FLEX, "sum_normalize": FLEX,
    "neg_inf_fill": "-inf is how a score_mod masks, and flex_attention gives 0, not NaN, for a row whose scores "
                    "are all -inf: no NaN row to spread",
    "cache_top_left": NO_CACHE, "cache_off_by_one": NO_CACHE, "cache_positions_from_zero": NO_CACHE,
}


def causal_padding(keep, bug):
    """The score_mod: causal, and the padded keys out where keep (B, T) is given."""
    shift = {"off_by_one": -1, "sees_next": 1}.get(bug, 0)

    def score_mod(score, b, h, q_idx, kv_idx):
        allowed = q_idx + shift >= kv_idx
        if keep is not None:
            allowed = allowed & keep[b, kv_idx]
        return torch.where(allowed, score, -float("inf"))
    return score_mod


class Attention(nn.Module):
    def __init__(self, bug):
        super().__init__()
        self.bug = bug
        self.c_attn, self.c_proj = nn.Linear(D, 3 * D, bias=False), nn.Linear(D, D, bias=False)

    def forward(self, x, score_mod, cos, sin):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, HEADS, HEAD_DIM).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = flex_attention(q, k, v, score_mod=score_mod, scale=scale(HEAD_DIM, self.bug))
        return self.c_proj(merge(y, self.bug))


class FlexGPT(nn.Module):
    def __init__(self, bug=None):
        super().__init__()
        self.bug = bug
        self.wte = nn.Embedding(VOCAB, D)
        self.h = nn.ModuleList(TransformerBlock(Attention(bug)) for _ in range(LAYERS))
        self.ln_f, self.lm_head = RMSNorm(), nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx, attention_mask=None):
        keep = None if attention_mask is None or self.bug == "mask_ignored" else attention_mask.bool()
        score_mod = causal_padding(keep, self.bug)
        cos, sin = rope_cos_sin(torch.arange(idx.shape[1], device=idx.device), HEAD_DIM)
        x = self.wte(idx)
        for block in self.h:
            x = block(x, score_mod, cos, sin)
        return self.lm_head(self.ln_f(x))


def build(bug=None, seed=0):
    return built(FlexGPT, bug, PLANTED, seed)


def padded(model, ids, keep):
    return model(ids, attention_mask=keep.long())


__getattr__ = factories(build, PLANTED)
