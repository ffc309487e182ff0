"""torchtune's manner (torchtune/modules/transformer.py, attention.py, kv_cache.py): a
`TransformerDecoder` of `TransformerSelfAttentionLayer`s around a `MultiHeadAttention` built from
separate q/k/v/output projections and a `RotaryPositionalEmbeddings` called with `input_pos`;
grouped kv heads expanded to the query heads; SDPA with `is_causal` when no mask is given.

Interface: `forward(tokens, *, mask=None, input_pos=None)`. `mask` is torchtune's: a (B, S, S) bool
(True = may attend, the causal part included; under a cache (B, S, max_seq_len)); padding reaches
the model only through it (`torchtune.generation.get_causal_mask_from_padding_mask`, re-made below
for the bed's own driver), with positions from `get_position_ids_from_padding_mask`. The cache:
`setup_caches(batch_size, dtype, decoder_max_seq_len=...)` gives each layer a `KVCache` that keeps
its own write position (`cache_pos`) and returns the whole buffer; with caches on, `mask` and
`input_pos` are required, as torchtune's `_validate_inputs` says. The factory sets up no cache
(as torchtune's training recipes build a model)."""
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
    RMSNorm,
    SwiGLU,
    built,
    factories,
    freqs_cis,
    merge,
    rotate_complex,
    scale,
)

PLANTED = {
    "no_scaling": "scaled_dot_product_attention(..., scale=1.0)",
    "mask_ignored": "the mask is taken and dropped: attn_mask=None, is_causal=True",
    "no_transpose_merge": "output.contiguous().view(b, s, -1) without output.transpose(1, 2)",
    "cache_positions_from_zero": "pos_embeddings(q) without input_pos: rotary positions from 0 under the cache",
}
SDPA = "scaled_dot_product_attention computes the softmax: no softmax of its own to get wrong"
CANNOT = {
    "off_by_one": "the causal mask is the caller's (is_causal=True without one): the model has none of its own",
    "sees_next": "the causal mask is the caller's (is_causal=True without one): the model has none of its own",
    "softmax_over_queries": SDPA, "naive_softmax": SDPA, "sum_normalize": SDPA,
    "neg_inf_fill": "the mask is bool into scaled_dot_product_attention, which gives 0 (not NaN) for a row with "
                    "no visible key (torch >= 2.5): an -inf fill has no NaN row to spread",
    "cache_top_left": "under a cache the (B, S, max_seq_len) causal mask is the caller's (torchtune.generation)",
    "cache_off_by_one": "KVCache writes at its own cache_pos and returns the whole buffer under the caller's mask: "
                        "nothing in the model reads a length",
}


def get_causal_mask_from_padding_mask(padding_mask):
    """(B, S) bool, True = real -> (B, S, S) bool, True = may attend; a padding query sees itself."""
    S = padding_mask.shape[1]
    mask = torch.tril(torch.ones(S, S, dtype=torch.bool, device=padding_mask.device))[None] & padding_mask[:, None, :]
    return mask | torch.eye(S, dtype=torch.bool, device=padding_mask.device)[None]


def get_position_ids_from_padding_mask(padding_mask):
    return ((padding_mask.cumsum(-1) - 1) * padding_mask).long()


class KVCache(nn.Module):
    def __init__(self, batch_size, max_seq_len, num_heads, head_dim, dtype):
        super().__init__()
        shape = (batch_size, num_heads, max_seq_len, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("cache_pos", torch.arange(0, max_seq_len), persistent=False)

    def reset(self):
        self.k_cache.zero_()
        self.v_cache.zero_()
        self.cache_pos -= self.size

    @property
    def size(self) -> int:
        return int(self.cache_pos[0])

    def update(self, k_val, v_val):
        bsz, _, seq_len, _ = k_val.shape
        if bsz > self.k_cache.shape[0]:
            raise ValueError(f"The current cache has been setup with a batch size of {self.k_cache.shape[0]}, "
                             f"but found new key tensors with batch size {bsz}!")
        assert self.size + seq_len <= self.k_cache.shape[2]
        self.k_cache[:, :, self.cache_pos[:seq_len]] = k_val
        self.v_cache[:, :, self.cache_pos[:seq_len]] = v_val
        self.cache_pos.add_(seq_len)
        return self.k_cache, self.v_cache


class RotaryPositionalEmbeddings(nn.Module):
    def __init__(self, dim, max_seq_len):
        super().__init__()
        self.register_buffer("cache", torch.view_as_real(freqs_cis(dim, max_seq_len)), persistent=False)

    def forward(self, x, *, input_pos=None):
        """x: [b, s, n_h, h_d]; input_pos: [b, s] or None (0..s-1)."""
        table = torch.view_as_complex(self.cache.float())
        fc = table[: x.shape[1]] if input_pos is None else table[input_pos]
        if fc.dim() == 3:   # one row of positions per sequence: rotate each row by its own
            return torch.stack([rotate_complex(x[i:i + 1], fc[i])[0] for i in range(x.shape[0])])
        return rotate_complex(x, fc)


class MultiHeadAttention(nn.Module):
    def __init__(self, bug):
        super().__init__()
        self.bug, self.num_heads, self.num_kv_heads, self.head_dim = bug, HEADS, KV_HEADS, HEAD_DIM
        self.q_proj = nn.Linear(D, HEADS * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(D, KV_HEADS * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(D, KV_HEADS * HEAD_DIM, bias=False)
        self.output_proj = nn.Linear(D, D, bias=False)
        self.pos_embeddings = RotaryPositionalEmbeddings(HEAD_DIM, MAX_POS)
        self.kv_cache, self.is_causal = None, True

    def setup_cache(self, batch_size, dtype, max_seq_len):
        # k and v are expanded to the query heads before the cache, so it holds num_heads
        self.kv_cache = KVCache(batch_size, max_seq_len, self.num_heads, self.head_dim, dtype)

    def forward(self, x, *, mask=None, input_pos=None):
        b, s_x, _ = x.shape
        q_per_kv = self.num_heads // self.num_kv_heads
        q = self.q_proj(x).view(b, s_x, self.num_heads, self.head_dim)
        rope_pos = None if self.bug == "cache_positions_from_zero" else input_pos
        q = self.pos_embeddings(q, input_pos=rope_pos).transpose(1, 2)
        k = self.pos_embeddings(self.k_proj(x).view(b, s_x, -1, self.head_dim), input_pos=rope_pos)
        v = self.v_proj(x).view(b, s_x, -1, self.head_dim)
        # [b, s, n_kv, 1, h_d] expanded to the query heads, then [b, n_h, s, h_d]
        k = k[:, :, :, None].expand(b, s_x, self.num_kv_heads, q_per_kv, self.head_dim).reshape(b, s_x, -1, self.head_dim)
        v = v[:, :, :, None].expand(b, s_x, self.num_kv_heads, q_per_kv, self.head_dim).reshape(b, s_x, -1, self.head_dim)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if self.kv_cache is not None:
            k, v = self.kv_cache.update(k, v)
        if self.bug == "mask_ignored":
            mask = None
        output = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None if mask is None else mask[:, None, :, :], dropout_p=0.0,
            is_causal=self.kv_cache is None and mask is None and self.is_causal, scale=scale(self.head_dim, self.bug))
        return self.output_proj(merge(output, self.bug))


class TransformerSelfAttentionLayer(nn.Module):
    def __init__(self, attn, mlp):
        super().__init__()
        self.attn, self.mlp, self.sa_norm, self.mlp_norm = attn, mlp, RMSNorm(), RMSNorm()

    def forward(self, x, *, mask=None, input_pos=None):
        h = x + self.attn(self.sa_norm(x), mask=mask, input_pos=input_pos)
        return h + self.mlp(self.mlp_norm(h))


class TransformerDecoder(nn.Module):
    def __init__(self, bug=None):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(TransformerSelfAttentionLayer(MultiHeadAttention(bug), SwiGLU()) for _ in range(LAYERS))
        self.norm, self.output = RMSNorm(), nn.Linear(D, VOCAB, bias=False)
        self.max_seq_len = MAX_POS

    def setup_caches(self, batch_size, dtype, *, encoder_max_seq_len=None, decoder_max_seq_len=None):
        for layer in self.layers:
            layer.attn.setup_cache(batch_size, dtype, decoder_max_seq_len or self.max_seq_len)

    def caches_are_enabled(self) -> bool:
        return self.layers[0].attn.kv_cache is not None

    def reset_caches(self):
        for layer in self.layers:
            layer.attn.kv_cache.reset()

    def forward(self, tokens, *, mask=None, input_pos=None):
        if self.caches_are_enabled() and (mask is None or input_pos is None):
            raise ValueError("KV-caches for self-attention layers are setup for inference mode, causal masks and "
                             "input positions must be provided")
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, mask=mask, input_pos=input_pos)
        return self.output(self.norm(h)).float()


def build(bug=None, seed=0):
    return built(TransformerDecoder, bug, PLANTED, seed)


def padded(model, ids, keep):
    return model(ids, mask=get_causal_mask_from_padding_mask(keep), input_pos=get_position_ids_from_padding_mask(keep))


def cached(model, ids, n_new):
    """torchtune.generation's way: caches for the batch, the causal mask rows at input_pos."""
    B, T = ids.shape
    P = T - n_new
    model.setup_caches(B, torch.float32, decoder_max_seq_len=T)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))[None].expand(B, T, T)
    pos = torch.arange(T)[None].expand(B, T)
    try:
        model(ids[:, :P], mask=causal[:, :P], input_pos=pos[:, :P])
        return model(ids[:, P:], mask=causal[:, P:], input_pos=pos[:, P:])
    finally:   # back to the cache-free model the factory built
        for layer in model.layers:
            layer.attn.kv_cache = None


__getattr__ = factories(build, PLANTED)
