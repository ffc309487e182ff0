"""FlexAttention through a `mask_mod` and `create_block_mask` (gpt-fast's flex branch, attention-
gym's examples): a causal mask_mod, `and_masks` with a padding mask_mod over a captured keep
tensor, a BlockMask made for each call's (T, kv length) with `BLOCK_SIZE=8` (a tiny model's
block); gpt-fast's KV cache (its `KVCache`, `setup_caches`, a 1-D `input_pos`), under which the
keys are the whole buffer and the causal mask_mod is offset by the step's first position. On CPU
(torch 2.13) flex_attention runs forward only.

Interface: `forward(idx, input_pos=None, attention_mask=None)`; `attention_mask` (B, T), 1 = a real
token (not with a cache); `setup_caches(max_batch_size, max_seq_length)` turns the cache on (the
factory leaves it off). Besides the catalogue's bugs, the known FlexAttention ones that reproduce
on CPU: a BlockMask kept from one call and reused at another length (torch >= 2.6 raises on the
length), a decode step's mask_mod without its offset, and the offset taken from the block index."""
import torch
import torch.nn as nn
from torch.nn.attention.flex_attention import and_masks, create_block_mask, flex_attention

from doctor_lab.styles._common import (
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    D,
    MetaTransformer,
    built,
    factories,
    merge,
    rope_cos_sin,
    rotate,
    scale,
)
from doctor_lab.styles.gpt_fast import KVCache

BLOCK = 8
# gpt-fast's KVCache (written in place in the cache's dtype): under bfloat16 autocast the write raises,
# a limit of the target the doctor names (inconclusive), as for gpt_fast.py: no hazard
HAZARDS = ()
PLANTED = {
    "no_scaling": "flex_attention(..., scale=1.0)",
    "off_by_one": "the causal mask_mod keeps q_idx > kv_idx",
    "sees_next": "the causal mask_mod keeps q_idx + 1 >= kv_idx",
    "mask_ignored": "attention_mask taken and not and_masks'ed in",
    "no_transpose_merge": "y.reshape(B, T, C) without y.transpose(1, 2)",
    "cache_positions_from_zero": "rotary positions 0..T-1 under the cache (not input_pos)",
    "decode_no_offset": "under the cache the causal mask_mod compares q_idx (0..T-1) with kv_idx: no input_pos[0] offset",
    "blockmask_block_offset": "the mask_mod's offset taken from the block index, input_pos[0] // BLOCK * BLOCK (as when "
                              "a BlockMask is sliced by block): right only where the step starts on a block boundary",
    "blockmask_reused": "self.block_mask made at the first call and kept: later calls reuse it at their own length "
                        "and padding",
}
FLEX = "flex_attention computes the softmax: no softmax of its own to get wrong"
CANNOT = {
    "softmax_over_queries": FLEX, "naive_softmax": FLEX, "sum_normalize": FLEX,
    "neg_inf_fill": "a mask_mod masks with booleans and flex_attention gives 0 for a row with no visible key: no -inf fill",
    "cache_top_left": "is decode_no_offset here: the BlockMask's q_idx count from 0 under the cache",
    "cache_off_by_one": "it reads the whole cache buffer under the mask_mod: no read length to get wrong",
}


def causal(offset, bug):
    shift = {"off_by_one": -1, "sees_next": 1}.get(bug, 0)

    def causal_mask(b, h, q_idx, kv_idx):
        return q_idx + offset + shift >= kv_idx
    return causal_mask


def padding(keep):
    def padding_mask(b, h, q_idx, kv_idx):
        return keep[b, kv_idx]
    return padding_mask


class Attention(nn.Module):
    def __init__(self, bug):
        super().__init__()
        self.bug = bug
        self.wqkv = nn.Linear(D, (HEADS + 2 * KV_HEADS) * HEAD_DIM, bias=False)
        self.wo = nn.Linear(D, D, bias=False)
        self.kv_cache = None

    def forward(self, x, block_mask, cos, sin, input_pos):
        B, T, _ = x.shape
        q, k, v = self.wqkv(x).split([D, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
        q = rotate(q.view(B, T, HEADS, HEAD_DIM).transpose(1, 2), cos, sin)
        k = rotate(k.view(B, T, KV_HEADS, HEAD_DIM).transpose(1, 2), cos, sin)
        v = v.view(B, T, KV_HEADS, HEAD_DIM).transpose(1, 2)
        if self.kv_cache is not None:
            k, v = self.kv_cache.update(input_pos, k, v)
        y = flex_attention(q, k, v, block_mask=block_mask, scale=scale(HEAD_DIM, self.bug), enable_gqa=True)
        return self.wo(merge(y, self.bug))


class Transformer(MetaTransformer):
    Attention = Attention

    def __init__(self, bug=None):
        super().__init__(bug)
        self.max_batch_size = self.max_seq_length = -1
        self.block_mask = None

    def setup_caches(self, max_batch_size, max_seq_length):
        self.max_seq_length, self.max_batch_size = -(-max_seq_length // BLOCK) * BLOCK, max_batch_size
        for b in self.layers:
            b.attention.kv_cache = KVCache(max_batch_size, self.max_seq_length, KV_HEADS, HEAD_DIM, self.output.weight.dtype)

    def mask_for(self, B, T, input_pos, keep):
        """The BlockMask of this call: causal from the step's offset (under a cache), and the padding."""
        caching = self.max_seq_length > 0
        if keep is not None and caching:
            raise ValueError("a padding mask with the KV cache is not supported (gpt-fast's cache takes none)")
        offset = int(input_pos.reshape(-1)[0]) if caching else 0
        if self.bug == "decode_no_offset":
            offset = 0
        elif self.bug == "blockmask_block_offset":
            offset = offset // BLOCK * BLOCK
        mask_mod = causal(offset, self.bug)
        if keep is not None and self.bug != "mask_ignored":
            mask_mod = and_masks(mask_mod, padding(keep))
        kv_len = self.max_seq_length if caching else T
        return create_block_mask(mask_mod, None if keep is None else B, None, T, kv_len, device=str(input_pos.device),
                                 BLOCK_SIZE=BLOCK)

    def forward(self, idx, input_pos=None, attention_mask=None):
        B, T = idx.shape
        input_pos = torch.arange(T, device=idx.device) if input_pos is None else input_pos
        keep = None if attention_mask is None else attention_mask.bool()
        block_mask = self.mask_for(B, T, input_pos, keep)
        if self.bug == "blockmask_reused":
            self.block_mask = block_mask if self.block_mask is None else self.block_mask
            block_mask = self.block_mask
        rope_pos = torch.arange(T, device=idx.device) if self.bug == "cache_positions_from_zero" else input_pos
        cos, sin = rope_cos_sin(rope_pos, HEAD_DIM)
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, block_mask, cos, sin, input_pos)
        return self.output(self.norm(x))


def build(bug=None, seed=0):
    return built(Transformer, bug, PLANTED, seed)


def padded(model, ids, keep):
    return model(ids, attention_mask=keep.long())


def cached(model, ids, n_new):
    """gpt-fast's flex generate: setup_caches, the prompt at 0..P-1, then the new tokens at P..T-1."""
    B, T = ids.shape
    P = T - n_new
    model.setup_caches(B, T)
    try:
        model(ids[:, :P], torch.arange(P))
        return model(ids[:, P:], torch.arange(P, T))
    finally:   # back to the cache-free model the factory built
        model.max_seq_length = -1
        for layer in model.layers:
            layer.attention.kv_cache = None


__getattr__ = factories(build, PLANTED)
