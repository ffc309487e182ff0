"""The generated attention: q/k/v made by the style's layout, positions applied, the scores written
in the style's notation and layout, masked in its encoding, normalised its way, merged. Every bug is
one condition in one place here (or in lm.py's positions and cache)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

from doctor_lab.generated import positions as P

HEAD_DIM = 16
P_DROP = 0.1
# the differential maps' dims: [0, d/4) + [d/2, 3d/4) and the rest, so that each holds whole rotary pairs
# in both notations (half-rotation: i with i + d/2; complex: 2i with 2i + 1)
DIFF_HALVES = tuple(torch.tensor([i for i in range(HEAD_DIM) if (i % (HEAD_DIM // 2) < HEAD_DIM // 4) == first])
                    for first in (True, False))
SIGMOID_BIAS = math.log(16)   # sigmoid attention's -log n, n fixed: a bias that moved with T_k would move with padding
# where each axis of a score tensor sits, per notation: (batch, head, query, key); bmm merges b and h
LAYOUT = {"matmul": (0, 1, 2, 3), "einsum_bhqk": (0, 1, 2, 3), "einsum_bqhk": (0, 2, 1, 3), "bmm": (0, 0, 1, 2)}


# -- the causal mask and the padding, in the style's encoding -----------------------------------

def keep_mask(pad, t_q, t_k, offset, style, bug, device):
    """(B|1, 1, t_q, t_k) bool, True = may attend; pad (B, t_k) bool or None. Query i sits at
    offset + i (lower-right under a cache; cache_top_left: at i)."""
    offset = 0 if bug == "cache_top_left" else offset
    diag = offset + {"off_by_one": -1, "sees_next": 1}.get(bug, 0)
    if bug == "no_causal_mask":
        causal = torch.ones(t_q, t_k, dtype=torch.bool, device=device)
    elif style["mask"] == "tril":   # nanoGPT's notation: a 0/1 lower triangle, compared with 0 when filled
        causal = torch.ones(t_q, t_k, device=device).tril(diag) != 0
    else:
        causal = torch.arange(t_k, device=device)[None, :] <= torch.arange(t_q, device=device)[:, None] + diag
    if pad is None:
        return causal[None, None]
    if bug == "unexpanded_mask":    # (t_q, t_k) & (B, t_k): broadcasts onto the queries when B == t_q
        return (causal & pad)[None, None]
    keep = causal[None, None] & pad[:, None, None, :]
    if style["mask"] == "additive_neginf" and bug != "neg_inf_fill":   # a padded query keeps its own key
        own = torch.arange(t_k, device=device)[None, :] == torch.arange(t_q, device=device)[:, None] + offset
        keep = keep | (own[None, None] & ~pad[:, None, -t_q:, None])
    return keep


def fill_value(style, bug, dtype):
    if bug == "finite_mask":
        return -1e4
    if bug == "neg_inf_fill" or style["mask"] == "additive_neginf":
        return float("-inf")
    return torch.finfo(dtype).min


def to_layout(t, layout, B, H):
    """A (B|1, H|1, T_q, T_k) tensor in the notation's score layout."""
    t = t.expand(B, H, *t.shape[-2:])
    if layout == LAYOUT["einsum_bqhk"]:
        return t.permute(0, 2, 1, 3)
    if layout == LAYOUT["bmm"]:
        return t.reshape(B * H, *t.shape[-2:])
    return t


def apply_mask(s, keep, style, bug):
    """Scores with the masked ones filled, in the style's encoding (keep already in s's layout)."""
    fill = fill_value(style, bug, s.dtype)
    if bug == "sum_normalize":      # a masked sum: the masked entries are 0
        return s.masked_fill(~keep, 0.0)
    if style["mask"] in ("additive_min", "additive_neginf"):
        return s + torch.zeros_like(s).masked_fill(~keep, fill)
    if style["mask"] == "tril":
        return s.masked_fill(keep.to(s.dtype) == 0, fill)
    return s.masked_fill(~keep, fill)


# -- normalisation ---------------------------------------------------------------------------

def softmax(s, q_dim, k_dim, bug):
    if bug == "naive_softmax":
        e = s.exp()
        return e / e.sum(k_dim, keepdim=True)
    if bug == "sum_normalize":
        return s / s.sum(k_dim, keepdim=True)
    return F.softmax(s, dim=q_dim if bug == "softmax_over_queries" else k_dim)


def normalise(s, layout, norm, bug, sinks=None):
    """Weights from scores over the keys' axis of the layout."""
    _, h_dim, q_dim, k_dim = layout
    if norm == "sigmoid":
        return torch.sigmoid(s - SIGMOID_BIAS)
    if norm == "sinks":   # one logit per head joins each row, then is dropped
        shape = [1] * s.dim()
        shape[h_dim] = -1
        sink = sinks.view(shape) if h_dim != layout[0] else sinks.repeat(s.shape[0] // sinks.numel())[:, None, None]
        sink = sink.expand(*[n if d != k_dim else 1 for d, n in enumerate(s.shape)])
        w = softmax(torch.cat([s, sink], k_dim), q_dim, k_dim, bug)
        return w.narrow(k_dim, 0, s.shape[k_dim])
    return softmax(s, q_dim, k_dim, bug)


# -- the notations -----------------------------------------------------------------------------

def scores(q, k, notation, scale, bug):
    """q, k (B, H, T, d) -> scores in the notation's layout; q scaled before the product (the
    scale after it: scale_after)."""
    qs = q if bug == "scale_after" else q * scale
    if notation == "matmul":
        s = qs @ k.transpose(-2, -1)
    elif notation == "einsum_bhqk":
        s = torch.einsum("bhqd,bhkd->bhqk", qs, k)
    elif notation == "einsum_bqhk":
        s = torch.einsum("bqhd,bkhd->bqhk", qs.transpose(1, 2), k.transpose(1, 2))
    else:
        B, H, T, d = q.shape
        s = torch.bmm(qs.reshape(B * H, T, d), k.reshape(B * H, -1, d).transpose(1, 2))
    return s * scale if bug == "scale_after" else s


def weighted(w, v, notation):
    """Weights in the notation's layout times v (B, H, T_k, d) -> (B, H, T_q, d)."""
    if notation in ("matmul",):
        return w @ v
    if notation == "einsum_bhqk":
        return torch.einsum("bhqk,bhkd->bhqd", w, v)
    if notation == "einsum_bqhk":
        return torch.einsum("bqhk,bkhd->bhqd", w, v.transpose(1, 2))
    B, H, T, d = v.shape
    return torch.bmm(w, v.reshape(B * H, T, d)).view(B, H, -1, d)


def own_attention(q, k, v, keep, bias, style, bug, scale, sinks, lam, training):
    notation, norm = style["scores"], style["norm"]
    layout = LAYOUT[notation]
    B, H = q.shape[:2]
    keep = to_layout(keep, layout, B, H)

    def weights(q, k, scale):
        s = scores(q, k, notation, scale, bug)
        if bias is not None:
            s = s + to_layout(bias, layout, B, H)
        return normalise(apply_mask(s, keep, style, bug), layout, norm, bug, sinks)

    if norm == "differential":   # two maps on two halves of the head dims, each keeping whole rotary pairs
        a, b = DIFF_HALVES
        s2 = scale * math.sqrt(2)
        w = weights(q[..., a], k[..., a], s2) - lam * weights(q[..., b], k[..., b], s2)
    else:
        w = weights(q, k, scale)
    w = F.dropout(w, P_DROP, training=training or bug == "dropout_in_eval")
    return weighted(w, v, notation)


def sdpa_attention(q, k, v, keep, bias, style, bug, scale, training):
    if bias is not None or style["mask"] != "bool" or bug in ("finite_mask", "neg_inf_fill"):
        mask = torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill(~keep, fill_value(style, bug, q.dtype))
        mask = mask if bias is None else mask + bias
    else:
        mask = keep
    p = P_DROP if training or bug == "dropout_in_eval" else 0.0
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=scale)


def flex(q, k, v, keep, bias, style, bug, scale):
    fill = fill_value(style, bug, q.dtype)
    keep3 = keep[:, 0].expand(q.shape[0], -1, -1)
    bias3 = None if bias is None else bias[0]

    def score_mod(score, b, h, q_idx, kv_idx):
        score = score if bias3 is None else score + bias3[h, q_idx, kv_idx]
        return torch.where(keep3[b, q_idx, kv_idx], score, fill)

    return flex_attention(q, k, v, score_mod=score_mod, scale=scale)


# -- the module ------------------------------------------------------------------------------

class Attention(nn.Module):
    """Self-attention of the style's q/k/v layout; forward(x, pos, keep_or_pad, past) -> (y, (k, v))."""

    def __init__(self, style, bug, d_model):
        super().__init__()
        self.style, self.bug = style, bug
        self.heads = d_model // HEAD_DIM
        self.kv_heads = self.heads // 2 if style["qkv"] == "grouped" else self.heads
        qkv, kv = style["qkv"], self.kv_heads * HEAD_DIM
        if qkv == "fused":
            self.c_attn = nn.Linear(d_model, 3 * d_model, bias=False)
        else:
            self.wq = nn.Linear(d_model, d_model, bias=False)
        if qkv in ("separate",):
            self.wk, self.wv = nn.Linear(d_model, kv, bias=False), nn.Linear(d_model, kv, bias=False)
        elif qkv == "grouped":
            self.wkv = nn.Linear(d_model, 2 * kv, bias=False)
        elif qkv == "latent":
            self.w_dkv = nn.Linear(d_model, d_model // 2, bias=False)
            self.w_uk, self.w_uv = nn.Linear(d_model // 2, kv, bias=False), nn.Linear(d_model // 2, kv, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)
        self.sinks = nn.Parameter(torch.zeros(self.heads)) if style["norm"] == "sinks" else None
        self.lam = nn.Parameter(torch.tensor(0.5)) if style["norm"] == "differential" else None
        self.slopes = P.alibi_slopes(self.heads) if style["positions"] == "alibi" else None
        if style["positions"] == "rope_complex":
            self.register_buffer("freqs_cis", P.freqs_cis(HEAD_DIM, bug), persistent=False)
        if style["init"] == "zero_out":
            nn.init.zeros_(self.wo.weight)

    def project(self, x):
        qkv = self.style["qkv"]
        if qkv == "fused":
            return self.c_attn(x).chunk(3, -1)
        if qkv == "separate":
            return self.wq(x), self.wk(x), self.wv(x)
        if qkv == "grouped":
            return (self.wq(x), *self.wkv(x).chunk(2, -1))
        c = self.w_dkv(x)
        return self.wq(x), self.w_uk(c), self.w_uv(c)

    def forward(self, x, pos, q_start, mask, past=None):
        """pos: the queries' positions (B|1, T); q_start: the first query's index among the keys (for
        ALiBi); mask: (B|1, 1, T_q, T_k) keep-mask (the LM built it) or a (B, T_k) padding keep-mask /
        None (this layer builds it, with the cache offset)."""
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, -1, HEAD_DIM).transpose(1, 2) for t in self.project(x))
        kind, table = self.style["positions"], getattr(self, "freqs_cis", None)
        q, k = P.rotate(q, pos, kind, self.bug, table), P.rotate(k, pos, kind, self.bug, table)
        if past is not None:
            k, v = join(past[0], k, self.bug), join(past[1], v, self.bug)
        kept = (k, v)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        t_k = k.shape[2]
        keep = mask if mask is not None and mask.dim() == 4 else keep_mask(mask, T, t_k, t_k - T, self.style, self.bug,
                                                                           x.device)
        if self.bug == "cosine_scores":
            q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        scale = 1.0 if self.bug in ("no_scaling", "cosine_scores") else HEAD_DIM ** -0.5
        bias = None if self.slopes is None else P.alibi(self.slopes, q_start, T, t_k).to(x)
        notation = self.style["scores"]
        if notation == "sdpa":
            y = sdpa_attention(q, k, v, keep, bias, self.style, self.bug, scale, self.training)
        elif notation == "flex":
            y = flex(q, k, v, keep, bias, self.style, self.bug, scale)
        else:
            y = own_attention(q, k, v, keep, bias, self.style, self.bug, scale, self.sinks, self.lam, self.training)
        y = (y if self.bug == "no_transpose_merge" else y.transpose(1, 2)).reshape(B, T, -1)
        return self.wo(y), kept


def join(past, new, bug):
    """The cache's (B, h, T_past, d) and the new (B, h, T, d); cache_off_by_one reads the cached ones a
    slot late (the first twice, the last lost)."""
    if bug == "cache_off_by_one" and past.shape[2] > 0:
        past = torch.cat([past[:, :, :1], past[:, :, :-1]], 2)
    return torch.cat([past, new], 2)
