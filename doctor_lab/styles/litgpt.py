"""LitGPT's manner (Lightning-AI/litgpt litgpt/model.py): `GPT` with `transformer.wte`,
`transformer.h` blocks and `lm_head`; one `qkv` linear split into q | k | v of grouped heads; the
half-rotation rotary from `cos` / `sin` buffers; SDPA with `is_causal=mask is None`; a `mask_cache`
(a square tril) that only the KV-cache path reads, selected at `input_pos`.

Interface: `forward(idx, input_pos=None, input_pos_maxp1=None)`; `input_pos` (T,) or (B, T), only
after `set_kv_cache(batch_size, max_seq_length=None, rope_cache_length=None, device=None,
dtype=None)` (else TypeError, as LitGPT); `clear_kv_cache()`. Without `input_pos_maxp1` the whole
cache is read under the mask (as LitGPT). No padding mask."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from doctor_lab.styles._common import (
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    LAYERS,
    MAX_POS,
    VOCAB,
    D,
    SwiGLU,
    built,
    causal_keep,
    factories,
    merge,
    rope_cos_sin,
    rotate,
    scale,
)

PLANTED = {
    "no_scaling": "scaled_dot_product_attention(..., scale=1.0)",
    "off_by_one": "build_mask_cache: tril(diagonal=-1) (only the cache path reads it)",
    "sees_next": "build_mask_cache: tril(diagonal=1) (only the cache path reads it)",
    "no_transpose_merge": "y.reshape(B, T, head_size * n_head) without y.transpose(1, 2)",
    "cache_top_left": "mask = mask_cache[:, :, :T] (rows from 0, not input_pos)",
    "cache_off_by_one": "input_pos_maxp1 derived as input_pos.max() (not + 1) when not given: the cache and "
                        "mask are sliced one short",
    "cache_positions_from_zero": "cos[:T], sin[:T] under the cache (not selected at input_pos)",
}
SDPA = "scaled_dot_product_attention computes the softmax: no softmax of its own to get wrong"
NO_PADDING = "LitGPT's forward takes idx, input_pos and input_pos_maxp1: no padding mask"
CANNOT = {"mask_ignored": NO_PADDING, "neg_inf_fill": NO_PADDING,
          "softmax_over_queries": SDPA, "naive_softmax": SDPA, "sum_normalize": SDPA}
# the mask cache is read only under a KV cache: its diagonal bugs show in the prefill, not in a plain forward
CACHE_PATH = (("kv_cache", "prefill_differs"),)
EXPECTS = {"off_by_one": CACHE_PATH, "sees_next": CACHE_PATH, "cache_off_by_one": CACHE_PATH}


def build_mask_cache(max_seq_length, bug, device=None):
    return causal_keep(max_seq_length, max_seq_length, bug, device)[None, None]


def batched_index_select(t, dim, idx):
    """t indexed at idx (T,) along dim; idx (B, T) gives a leading batch dim."""
    if idx.dim() == 1:
        return t.index_select(dim, idx)
    return torch.stack([t.index_select(dim, i) for i in idx])


class KVCache(nn.Module):
    def __init__(self, k_shape, v_shape, device=None, dtype=None):
        super().__init__()
        self.register_buffer("k", torch.zeros(k_shape, device=device, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(v_shape, device=device, dtype=dtype), persistent=False)

    def forward(self, input_pos, k, v):
        self.k, self.v = self.k.to(k.dtype), self.v.to(v.dtype)
        n = k.size(0)
        k_out, v_out = self.k[:n], self.v[:n]
        if input_pos.dim() == 1:
            return k_out.index_copy_(2, input_pos, k), v_out.index_copy_(2, input_pos, v)
        for b in range(n):   # one row of positions per sequence
            k_out[b].index_copy_(1, input_pos[b], k[b])
            v_out[b].index_copy_(1, input_pos[b], v[b])
        return k_out, v_out


class CausalSelfAttention(nn.Module):
    def __init__(self, bug):
        super().__init__()
        self.bug = bug
        self.qkv = nn.Linear(D, (HEADS + 2 * KV_HEADS) * HEAD_DIM, bias=False)
        self.proj = nn.Linear(HEADS * HEAD_DIM, D, bias=False)
        self.kv_cache = None

    def forward(self, x, cos, sin, mask=None, input_pos=None, input_pos_maxp1=None):
        B, T, _ = x.size()
        q, k, v = self.qkv(x).split((HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM), dim=-1)
        q = q.view(B, T, HEADS, HEAD_DIM).transpose(1, 2)
        k = k.view(B, T, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = v.view(B, T, KV_HEADS, HEAD_DIM).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if input_pos is not None:
            if not isinstance(self.kv_cache, KVCache):
                raise TypeError("You need to call `gpt.set_kv_cache()`")
            k, v = self.kv_cache(input_pos, k, v)
            if input_pos_maxp1 is not None:
                k, v = k[..., :input_pos_maxp1, :], v[..., :input_pos_maxp1, :]
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=scale(HEAD_DIM, self.bug),
                                           is_causal=mask is None)
        return self.proj(merge(y, self.bug))

    def build_kv_cache(self, batch_size, max_seq_length, device=None, dtype=None):
        shape = (batch_size, KV_HEADS, max_seq_length, HEAD_DIM)
        return KVCache(shape, shape, device=device, dtype=dtype)


class Block(nn.Module):
    def __init__(self, bug):
        super().__init__()
        self.norm_1, self.attn, self.norm_2, self.mlp = nn.LayerNorm(D), CausalSelfAttention(bug), nn.LayerNorm(D), SwiGLU()

    def forward(self, x, cos, sin, mask=None, input_pos=None, input_pos_maxp1=None):
        x = self.attn(self.norm_1(x), cos, sin, mask, input_pos, input_pos_maxp1) + x
        return self.mlp(self.norm_2(x)) + x


class GPT(nn.Module):
    def __init__(self, bug=None):
        super().__init__()
        self.bug = bug
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(VOCAB, D), h=nn.ModuleList(Block(bug) for _ in range(LAYERS)),
                                              ln_f=nn.LayerNorm(D)))
        self.max_seq_length = MAX_POS
        cos, sin = rope_cos_sin(torch.arange(MAX_POS), HEAD_DIM)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.mask_cache = None

    def set_kv_cache(self, batch_size, max_seq_length=None, rope_cache_length=None, device=None, dtype=None):
        max_seq_length = max_seq_length or self.max_seq_length
        for block in self.transformer.h:
            block.attn.kv_cache = block.attn.build_kv_cache(batch_size, max_seq_length, device, dtype)
        if self.mask_cache is None or self.mask_cache.size(3) != max_seq_length:
            # passing attn_mask to SDPA disables its flash path: made only for the cache (inference)
            self.mask_cache = build_mask_cache(max_seq_length, self.bug, device)

    def clear_kv_cache(self):
        self.mask_cache = None
        for block in self.transformer.h:
            block.attn.kv_cache = None

    def forward(self, idx, input_pos=None, input_pos_maxp1=None):
        T = idx.size(1)
        if self.max_seq_length < T:
            raise ValueError(f"Cannot forward sequence of length {T}, max seq length is only {self.max_seq_length}.")
        if input_pos is not None:   # use the kv cache
            if self.mask_cache is None:
                raise TypeError("You need to call `gpt.set_kv_cache()`")
            if self.bug == "cache_positions_from_zero":
                cos, sin = self.cos[:T], self.sin[:T]
            else:
                cos, sin = batched_index_select(self.cos, 0, input_pos), batched_index_select(self.sin, 0, input_pos)
            rows = torch.arange(T, device=idx.device) if self.bug == "cache_top_left" else input_pos
            mask = batched_index_select(self.mask_cache, 2, rows)
            if mask.dim() > 4:   # the mask cache's batch dim of 1 beside the one input_pos (B, T) gives
                mask = mask.view(*(mask.shape[0:1] + mask.shape[2:]))
            if input_pos_maxp1 is None and self.bug == "cache_off_by_one":
                input_pos_maxp1 = int(input_pos.max())
            if input_pos_maxp1 is not None:
                mask = mask[..., :input_pos_maxp1]
        else:
            cos, sin, mask, input_pos_maxp1 = self.cos[:T], self.sin[:T], None, None
        x = self.transformer.wte(idx)
        for block in self.transformer.h:
            x = block(x, cos, sin, mask, input_pos, input_pos_maxp1)
        return self.lm_head(self.transformer.ln_f(x))


def build(bug=None, seed=0):
    return built(GPT, bug, PLANTED, seed)


def cached(model, ids, n_new):
    """litgpt generate's way: set_kv_cache for the batch, prefill at 0..P-1, the new tokens at P..T-1."""
    B, T = ids.shape
    P = T - n_new
    model.set_kv_cache(batch_size=B)
    try:
        model(ids[:, :P], input_pos=torch.arange(P))
        return model(ids[:, P:], input_pos=torch.arange(P, T))
    finally:
        model.clear_kv_cache()


__getattr__ = factories(build, PLANTED)
