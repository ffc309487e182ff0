"""mistral-inference's manner (mistralai/mistral-inference transformer.py, transformer_layers.py,
cache.py), dense and on CPU: the batch is packed, tokens of all sequences in one flat (N,) tensor
with their lengths in `seqlens`; `wq` / `wk` / `wv` / `wo` on (N, D); a complex rotary table
indexed at each token's position; a `BufferCache(n_layers, max_batch_size, max_seq_len,
n_kv_heads, head_dim)` that keeps each sequence's length (`kv_seqlens`), hands each layer a
`CacheView` written with `index_copy_` at flat `cache_positions`, and makes the mask from the
metadata. Where mistral-inference calls xformers' `memory_efficient_attention` with a block-diagonal
bias, this one calls SDPA with the same mask made dense from (sequence, position) pairs.

Interface: `forward(input_ids, seqlens=None, cache=None)`: input_ids (N,) with `seqlens`, as
mistral-inference; a (B, T) batch with no seqlens is taken as B sequences of T and its logits
given back as (B, T, V). mistral-inference's own no-cache path passes no mask (it always generates
with a cache); here it gets the block-diagonal causal mask its first prefill gets. No padding mask:
sequences of different lengths are packed, never padded."""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from doctor_lab.styles._common import (
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    LAYERS,
    MAX_BATCH,
    MAX_POS,
    VOCAB,
    D,
    RMSNorm,
    TransformerBlock,
    built,
    factories,
    freqs_cis,
    rotate_complex,
    scale,
    separate_projections,
)

PLANTED = {
    "no_scaling": "scaled_dot_product_attention(..., scale=1.0)",
    "off_by_one": "the mask keeps key positions < the query's (not <=)",
    "sees_next": "the mask keeps key positions <= the query's + 1",
    "no_transpose_merge": "output (1, H, N, d).reshape(N, H d) without the transpose back to (1, N, H, d)",
    "cache_top_left": "under the cache the mask counts the new queries from 0 (xformers' BlockDiagonalCausalMask "
                      "with kv longer than q: top-left), not from the sequence's cached length",
    "cache_off_by_one": "cache.update_seqlens([s - 1 for s in seqlens]): the next step overwrites the last cached token",
    "cache_positions_from_zero": "rotary positions from 0 in every call (SimpleInputMetadata.from_seqlens), "
                                 "not the cache's lengths",
    "packed_sequences_mix": "the mask from positions alone (key position <= query position): the packed "
                            "sequences see each other's keys",
}
NO_PADDING = "mistral-inference packs sequences of different lengths (seqlens): no padding mask"
SDPA = "the attention kernel computes the softmax (xformers; SDPA here): no softmax of its own to get wrong"
CANNOT = {"mask_ignored": NO_PADDING, "neg_inf_fill": NO_PADDING,
          "softmax_over_queries": SDPA, "naive_softmax": SDPA, "sum_normalize": SDPA}


@dataclass
class CacheInputMetadata:
    positions: torch.Tensor         # rotary positions of the new tokens (N,)
    cache_positions: torch.Tensor   # where they go in the flat cache
    prefill: bool
    q_seq: torch.Tensor             # sequence and position of each query ...
    q_pos: torch.Tensor
    seqlens: list


class CacheView:
    def __init__(self, cache_k, cache_v, metadata, kv_seqlens):
        self.cache_k, self.cache_v, self.metadata, self.kv_seqlens = cache_k, cache_v, metadata, kv_seqlens

    def update(self, xk, xv):
        n_kv_heads, head_dim = self.cache_k.shape[-2:]
        self.cache_k.view(-1, n_kv_heads, head_dim).index_copy_(0, self.metadata.cache_positions, xk)
        self.cache_v.view(-1, n_kv_heads, head_dim).index_copy_(0, self.metadata.cache_positions, xv)

    def interleave_kv(self, xk, xv):
        """Each sequence's cached keys, then its new ones: (keys, values, their sequence, their position)."""
        ks, vs, seq, pos = [], [], [], []
        for b, (k, v, s) in enumerate(zip(xk.split(self.metadata.seqlens), xv.split(self.metadata.seqlens),
                                          self.metadata.seqlens)):
            n = int(self.kv_seqlens[b])
            ks += [self.cache_k[b, :n], k]
            vs += [self.cache_v[b, :n], v]
            seq.append(torch.full((n + s,), b))
            pos.append(torch.arange(n + s))
        return torch.cat(ks), torch.cat(vs), torch.cat(seq), torch.cat(pos)

    @property
    def max_seq_len(self):
        return self.cache_k.shape[1]


class BufferCache:
    def __init__(self, n_layers, max_batch_size, max_seq_len, n_kv_heads, head_dim):
        self.max_seq_len = max_seq_len
        self.cache_k = torch.zeros(n_layers, max_batch_size, max_seq_len, n_kv_heads, head_dim)
        self.cache_v = torch.zeros(n_layers, max_batch_size, max_seq_len, n_kv_heads, head_dim)
        self.kv_seqlens = None

    def get_view(self, layer_id, metadata):
        return CacheView(self.cache_k[layer_id], self.cache_v[layer_id], metadata, self.kv_seqlens)

    def reset(self):
        self.kv_seqlens = None

    def init_kvseqlens(self, batch_size):
        self.kv_seqlens = torch.zeros(batch_size, dtype=torch.long)

    def to(self, device, dtype):
        self.cache_k, self.cache_v = self.cache_k.to(device, dtype), self.cache_v.to(device, dtype)
        return self

    def update_seqlens(self, seqlens):
        self.kv_seqlens += torch.tensor(seqlens)

    def get_input_metadata(self, seqlens):
        if self.kv_seqlens is None:
            self.init_kvseqlens(len(seqlens))
        assert len(seqlens) == len(self.kv_seqlens), "did you forget to reset cache?"
        seqpos = self.kv_seqlens.tolist()
        positions = torch.cat([torch.arange(p, p + s) for p, s in zip(seqpos, seqlens)])
        batch_idx = torch.cat([torch.full((s,), b) for b, s in enumerate(seqlens)])
        prefill = seqpos[0] == 0 or any(s > 1 for s in seqlens)
        return CacheInputMetadata(positions, positions + batch_idx * self.max_seq_len, prefill, batch_idx, positions, seqlens)


def packed_mask(q_seq, q_pos, k_seq, k_pos, bug):
    """(N_q, N_k) bool, True = may attend: the same sequence, a key position up to the query's
    (the dense form of xformers' block-diagonal causal masks)."""
    shift = {"off_by_one": -1, "sees_next": 1}.get(bug, 0)
    keep = k_pos[None, :] <= q_pos[:, None] + shift
    return keep if bug == "packed_sequences_mix" else keep & (q_seq[:, None] == k_seq[None, :])


class Attention(nn.Module):
    def __init__(self, bug):
        super().__init__()
        self.bug, self.n_heads, self.head_dim, self.n_kv_heads = bug, HEADS, HEAD_DIM, KV_HEADS
        self.repeats = HEADS // KV_HEADS
        separate_projections(self)

    def forward(self, x, freqs, meta, cache=None):
        seqlen_sum, _ = x.shape
        xq = self.wq(x).view(seqlen_sum, self.n_heads, self.head_dim)
        xk = self.wk(x).view(seqlen_sum, self.n_kv_heads, self.head_dim)
        xv = self.wv(x).view(seqlen_sum, self.n_kv_heads, self.head_dim)
        xq, xk = rotate_complex(xq[None], freqs)[0], rotate_complex(xk[None], freqs)[0]
        q_seq, q_pos = meta.q_seq.to(x.device), meta.q_pos.to(x.device)
        if cache is None:
            key, val, k_seq, k_pos = xk, xv, q_seq, q_pos
        elif cache.metadata.prefill:
            key, val, k_seq, k_pos = cache.interleave_kv(xk, xv)
            cache.update(xk, xv)
        else:   # decoding: every sequence's whole buffer, its unwritten slots masked by position
            cache.update(xk, xv)
            B, L = len(cache.kv_seqlens), cache.max_seq_len
            key, val = cache.cache_k[:B].reshape(B * L, *xk.shape[1:]), cache.cache_v[:B].reshape(B * L, *xv.shape[1:])
            k_seq, k_pos = torch.arange(B).repeat_interleave(L), torch.arange(L).repeat(B)
        if cache is not None and self.bug == "cache_top_left":
            q_pos = q_pos - cache.kv_seqlens[q_seq]
        mask = packed_mask(q_seq, q_pos, k_seq.to(x.device), k_pos.to(x.device), self.bug)
        key, val = key.repeat_interleave(self.repeats, dim=1), val.repeat_interleave(self.repeats, dim=1)
        # (1, S, H, d) as xformers takes them; SDPA wants (1, H, S, d)
        q, k, v = (t[None].transpose(1, 2) for t in (xq, key, val))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale(self.head_dim, self.bug))
        out = out.reshape(seqlen_sum, -1) if self.bug == "no_transpose_merge" else out.transpose(1, 2).reshape(seqlen_sum, -1)
        return self.wo(out)


class Transformer(nn.Module):
    def __init__(self, bug=None):
        super().__init__()
        self.bug = bug
        self.tok_embeddings = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(Attention(bug)) for i in range(LAYERS)})
        self.norm, self.output = RMSNorm(), nn.Linear(D, VOCAB, bias=False)
        self._precomputed_freqs_cis = freqs_cis(HEAD_DIM, MAX_POS)

    def forward(self, input_ids, seqlens=None, cache=None):
        batch = None
        if input_ids.dim() == 2 and seqlens is None:   # (B, T): B sequences of T
            batch, seqlens, input_ids = input_ids.shape, [input_ids.shape[1]] * input_ids.shape[0], input_ids.reshape(-1)
        assert sum(seqlens) == input_ids.shape[0], (sum(seqlens), input_ids.shape[0])
        if cache is not None:
            meta = cache.get_input_metadata(seqlens)
        else:
            pos = torch.cat([torch.arange(s) for s in seqlens])
            meta = CacheInputMetadata(pos, pos, True, torch.cat([torch.full((s,), b) for b, s in enumerate(seqlens)]), pos, seqlens)
        rope_pos = torch.cat([torch.arange(s) for s in seqlens]) if self.bug == "cache_positions_from_zero" else meta.positions
        freqs = self._precomputed_freqs_cis.to(input_ids.device)[rope_pos.to(input_ids.device)]
        h = self.tok_embeddings(input_ids)
        for i, layer in enumerate(self.layers.values()):
            h = layer(h, freqs, meta, None if cache is None else cache.get_view(i, meta))
        if cache is not None:
            cache.update_seqlens([s - 1 for s in seqlens] if self.bug == "cache_off_by_one" else seqlens)
        out = self.output(self.norm(h)).float()
        return out if batch is None else out.view(*batch, -1)


def build(bug=None, seed=0):
    return built(Transformer, bug, PLANTED, seed)


def cached(model, ids, n_new):
    """generate.py's way: a BufferCache, the prompts as one packed prefill, then the new tokens."""
    B, T = ids.shape
    P = T - n_new
    cache = BufferCache(LAYERS, MAX_BATCH, T, KV_HEADS, HEAD_DIM)
    cache.init_kvseqlens(B)
    model(ids[:, :P].reshape(-1), seqlens=[P] * B, cache=cache)
    return model(ids[:, P:].reshape(-1), seqlens=[n_new] * B, cache=cache).view(B, n_new, -1)


__getattr__ = factories(build, PLANTED)
