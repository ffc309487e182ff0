"""Meta's Llama `model.py` manner (meta-llama/llama): separate `wq` / `wk` / `wv` / `wo`, a complex
`freqs_cis` table sliced at `start_pos`, `cache_k` / `cache_v` kept as plain tensors on each
attention and written at `start_pos`, `q k^T / sqrt(head_dim)` plus an additive -inf mask made with
`torch.triu` and widened by `torch.hstack` for the cached keys, `F.softmax(scores.float())`.

Interface: `forward(tokens, start_pos)` under `@torch.inference_mode()` (forward only: no gradient
reaches the weights); `start_pos` is required, as in Meta's code. No padding mask."""
import math

import torch
import torch.nn as nn

from doctor_lab.styles._common import (
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    MAX_BATCH,
    MAX_POS,
    MetaTransformer,
    built,
    factories,
    freqs_cis,
    merge,
    normalise,
    rotate_complex,
    separate_projections,
)

PLANTED = {
    "no_scaling": "scores = torch.matmul(xq, keys.transpose(2, 3)) without / math.sqrt(head_dim)",
    "off_by_one": "mask = torch.triu(mask, diagonal=0): the diagonal -inf too (row 0 has no key: NaN)",
    "sees_next": "mask = torch.triu(mask, diagonal=2)",
    "softmax_over_queries": "F.softmax(scores.float(), dim=-2)",
    "naive_softmax": "scores.float().exp() / its sum, no max subtracted",
    "no_transpose_merge": "output.contiguous().view(bsz, seqlen, -1) without output.transpose(1, 2)",
    "cache_top_left": "mask = torch.triu(full((seqlen, start_pos + seqlen), -inf), diagonal=1): no hstack of zeros",
    "cache_positions_from_zero": "freqs_cis[0:seqlen] (not [start_pos:start_pos + seqlen])",
}
# Meta's formula, healthy or not: matmul(xq, keys^T) / sqrt(head_dim) forms q k^T before the scale, which
# overflows float16 first (the classic bed's nanogpt and functional styles alike): the doctor's low_precision fails
HAZARDS = (("low_precision", "qk_before_scale"),)
NO_PADDING = "Llama's forward takes tokens and start_pos only: no padding mask"
CANNOT = {
    "mask_ignored": NO_PADDING, "neg_inf_fill": NO_PADDING,
    "sum_normalize": "the mask is additive -inf: scores / scores.sum() is NaN in every masked row, a non-finite "
                     "failure (naive_softmax's), not the catalogue's weights that sum to 1 but go negative",
    "cache_off_by_one": "the keys read ([:start_pos + seqlen]) and the mask's width share one length: a read one "
                        "short or long is a shape error on every call with seqlen > 1, not a silent cache bug",
}


class Attention(nn.Module):
    def __init__(self, bug):
        super().__init__()
        self.bug, self.n_local_heads, self.n_local_kv_heads, self.head_dim = bug, HEADS, KV_HEADS, HEAD_DIM
        self.n_rep = HEADS // KV_HEADS
        separate_projections(self)
        self.cache_k = torch.zeros(MAX_BATCH, MAX_POS, KV_HEADS, HEAD_DIM)
        self.cache_v = torch.zeros(MAX_BATCH, MAX_POS, KV_HEADS, HEAD_DIM)

    def forward(self, x, start_pos, freqs, mask):
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xk = self.wk(x).view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xv = self.wv(x).view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xq, xk = rotate_complex(xq, freqs), rotate_complex(xk, freqs)
        self.cache_k, self.cache_v = self.cache_k.to(xq), self.cache_v.to(xq)
        self.cache_k[:bsz, start_pos: start_pos + seqlen] = xk
        self.cache_v[:bsz, start_pos: start_pos + seqlen] = xv
        keys = self.cache_k[:bsz, : start_pos + seqlen].repeat_interleave(self.n_rep, dim=2)
        values = self.cache_v[:bsz, : start_pos + seqlen].repeat_interleave(self.n_rep, dim=2)
        xq, keys, values = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        scores = torch.matmul(xq, keys.transpose(2, 3))
        if self.bug != "no_scaling":
            scores = scores / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask
        scores = normalise(scores.float(), self.bug).type_as(xq)
        return self.wo(merge(torch.matmul(scores, values), self.bug))


class Transformer(MetaTransformer):
    Attention = Attention

    def __init__(self, bug=None):
        super().__init__(bug)
        self.freqs_cis = freqs_cis(HEAD_DIM, MAX_POS * 2)

    @torch.inference_mode()
    def forward(self, tokens, start_pos: int):
        _bsz, seqlen = tokens.shape
        h = self.tok_embeddings(tokens)
        self.freqs_cis = self.freqs_cis.to(h.device)
        first = 0 if self.bug == "cache_positions_from_zero" else start_pos
        freqs = self.freqs_cis[first: first + seqlen]
        mask = None
        if seqlen > 1:
            if self.bug == "cache_top_left":
                mask = torch.triu(torch.full((seqlen, start_pos + seqlen), float("-inf"), device=tokens.device), diagonal=1)
            else:
                diagonal = {"off_by_one": 0, "sees_next": 2}.get(self.bug, 1)
                mask = torch.triu(torch.full((seqlen, seqlen), float("-inf"), device=tokens.device), diagonal=diagonal)
                mask = torch.hstack([torch.zeros((seqlen, start_pos), device=tokens.device), mask])
            mask = mask.type_as(h)
        for layer in self.layers:
            h = layer(h, start_pos, freqs, mask)
        return self.output(self.norm(h)).float()


def build(bug=None, seed=0):
    return built(Transformer, bug, PLANTED, seed)


def plain(model, ids):
    return model(ids, 0)


def cached(model, ids, n_new):
    """generation.py's way: the prompt at start_pos 0, then the new tokens at start_pos P."""
    P = ids.shape[1] - n_new
    model(ids[:, :P], 0)
    return model(ids[:, P:], P)


__getattr__ = factories(build, PLANTED)
