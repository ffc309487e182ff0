"""gpt-fast's manner (pytorch-labs/gpt-fast model.py): a fused `wqkv` split into q | k | v of
grouped heads, Meta's complex rotary table indexed by `input_pos`, a `KVCache` module whose buffers
are written in place at a 1-D `input_pos` (`index_copy_`), the whole cache read under
`causal_mask[None, None, input_pos]` (an absolute, square bool mask made by `setup_caches`), SDPA.

Interface: `forward(idx, input_pos=None)`; `setup_caches(max_batch_size, max_seq_length)` must come
first (gpt-fast asserts it; the factory calls it, as generate.py does). One departure: gpt-fast
requires `input_pos`; here None means 0..T-1, so that a plain call runs. No padding mask."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from doctor_lab.styles._common import (
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    MAX_BATCH,
    MAX_POS,
    D,
    MetaTransformer,
    built,
    causal_keep,
    factories,
    freqs_cis,
    merge,
    rotate_complex,
    scale,
)

PLANTED = {
    "no_scaling": "scaled_dot_product_attention(..., scale=1.0)",
    "off_by_one": "setup_caches' causal_mask = tril(diagonal=-1)",
    "sees_next": "setup_caches' causal_mask = tril(diagonal=1)",
    "no_transpose_merge": "y.contiguous().view(bsz, seqlen, dim) without y.transpose(1, 2)",
    "cache_top_left": "mask = causal_mask[None, None, :seqlen] (rows from 0, not input_pos)",
    "cache_positions_from_zero": "freqs_cis[:seqlen] under the cache (not freqs_cis[input_pos])",
}
# its KVCache is written in place in the cache's dtype: under autocast, k arrives in bfloat16 and the
# write raises (gpt-fast casts its weights to bfloat16 instead). The doctor runs both and reads the
# autocast half as a limit of the target (inconclusive naming the buffer), not a fail: no hazard.
HAZARDS = ()
NO_PADDING = "gpt-fast's forward takes idx and input_pos only: no padding mask"
SDPA = "scaled_dot_product_attention computes the softmax: no softmax of its own to get wrong"
CANNOT = {
    "mask_ignored": NO_PADDING, "neg_inf_fill": NO_PADDING,
    "softmax_over_queries": SDPA, "naive_softmax": SDPA, "sum_normalize": SDPA,
    "cache_off_by_one": "it reads the whole cache buffer under causal_mask[input_pos]: no read length to get "
                        "wrong (a mask row off by one is off_by_one / sees_next, in every forward)",
}


class KVCache(nn.Module):
    def __init__(self, max_batch_size, max_seq_length, n_heads, head_dim, dtype=torch.float32):
        super().__init__()
        shape = (max_batch_size, n_heads, max_seq_length, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype))
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype))

    def update(self, input_pos, k_val, v_val):
        # input_pos: [S], k_val: [B, H, S, D]
        assert input_pos.shape[0] == k_val.shape[2]
        B = k_val.shape[0]
        self.k_cache[:B].index_copy_(2, input_pos, k_val)
        self.v_cache[:B].index_copy_(2, input_pos, v_val)
        return self.k_cache[:B], self.v_cache[:B]


class Attention(nn.Module):
    def __init__(self, bug):
        super().__init__()
        self.bug, self.n_head, self.n_local_heads, self.head_dim = bug, HEADS, KV_HEADS, HEAD_DIM
        self.wqkv = nn.Linear(D, (HEADS + 2 * KV_HEADS) * HEAD_DIM, bias=False)
        self.wo = nn.Linear(D, D, bias=False)
        self.kv_cache = None

    def forward(self, x, freqs, mask, input_pos):
        bsz, seqlen, _ = x.shape
        kv_size = self.n_local_heads * self.head_dim
        q, k, v = self.wqkv(x).split([D, kv_size, kv_size], dim=-1)
        q = rotate_complex(q.view(bsz, seqlen, self.n_head, self.head_dim), freqs)
        k = rotate_complex(k.view(bsz, seqlen, self.n_local_heads, self.head_dim), freqs)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.view(bsz, seqlen, self.n_local_heads, self.head_dim).transpose(1, 2)
        if self.kv_cache is not None:
            k, v = self.kv_cache.update(input_pos, k, v)
        k = k.repeat_interleave(self.n_head // self.n_local_heads, dim=1)
        v = v.repeat_interleave(self.n_head // self.n_local_heads, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=scale(self.head_dim, self.bug))
        return self.wo(merge(y, self.bug))


class Transformer(MetaTransformer):
    Attention = Attention

    def __init__(self, bug=None):
        super().__init__(bug)
        self.freqs_cis = None
        self.max_batch_size = self.max_seq_length = -1

    def setup_caches(self, max_batch_size, max_seq_length):
        if self.max_seq_length >= max_seq_length and self.max_batch_size >= max_batch_size:
            return
        max_seq_length = -(-max_seq_length // 8) * 8
        self.max_seq_length, self.max_batch_size = max_seq_length, max_batch_size
        dtype = self.output.weight.dtype
        for b in self.layers:
            b.attention.kv_cache = KVCache(max_batch_size, max_seq_length, KV_HEADS, HEAD_DIM, dtype)
        self.freqs_cis = freqs_cis(HEAD_DIM, max_seq_length)
        self.causal_mask = causal_keep(max_seq_length, max_seq_length, self.bug, "cpu")

    def forward(self, idx, input_pos=None):
        assert self.freqs_cis is not None, "Caches must be initialized first"
        T = idx.shape[1]
        input_pos = torch.arange(T, device=idx.device) if input_pos is None else input_pos
        rows = torch.arange(T, device=idx.device) if self.bug == "cache_top_left" else input_pos
        mask = self.causal_mask.to(idx.device)[None, None, rows]
        table = self.freqs_cis.to(idx.device)
        freqs = table[:T] if self.bug == "cache_positions_from_zero" else table[input_pos]
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, freqs, mask, input_pos)
        return self.output(self.norm(x))


def build(bug=None, seed=0):
    def make(bug):
        model = Transformer(bug)
        model.setup_caches(max_batch_size=MAX_BATCH, max_seq_length=MAX_POS)
        return model
    return built(make, bug, PLANTED, seed)


def cached(model, ids, n_new):
    """generate.py's way: prefill with input_pos 0..P-1, then the new tokens at P..T-1."""
    P, T = ids.shape[1] - n_new, ids.shape[1]
    model(ids[:, :P], torch.arange(P))
    return model(ids[:, P:], torch.arange(P, T))


__getattr__ = factories(build, PLANTED)
