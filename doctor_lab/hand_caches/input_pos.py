"""gpt-fast's model.py as it is (pytorch-labs/gpt-fast, read, not copied; the styles bed's
gpt_fast.py departs from it so that a plain call runs): `forward(idx, input_pos)` asserts its caches
are set up (`setup_caches(max_batch_size, max_seq_length)`, which generate.py calls first) and
indexes its square causal mask and its complex rotary table by `input_pos`, so a call without
positions raises; its KVCache modules write every row of their buffers at `input_pos` and the whole
buffer is read under the mask's rows.

Planted: a top-left mask on the step (`causal_mask[None, None, :T]`, rows from 0 not input_pos) and
the rotary table sliced from 0 (`freqs_cis[:T]`, not `freqs_cis[input_pos]`)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from doctor_lab.hand_caches._parts import HEAD_DIM, HEADS, KV_HEADS, LAYERS, VOCAB, D, built, factories

PLANTED = {
    "cache_top_left": "mask = causal_mask[None, None, :T] (rows from 0, not input_pos)",
    "cache_positions_from_zero": "freqs_cis[:T] (not freqs_cis[input_pos])",
}


class KVCache(nn.Module):
    def __init__(self, max_batch_size, max_seq_length, n_heads, head_dim, dtype):
        super().__init__()
        shape = (max_batch_size, n_heads, max_seq_length, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype))
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype))

    def update(self, input_pos, k, v):
        self.k_cache[:, :, input_pos] = k
        self.v_cache[:, :, input_pos] = v
        return self.k_cache, self.v_cache


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wqkv = nn.Linear(D, (HEADS + 2 * KV_HEADS) * HEAD_DIM, bias=False)
        self.wo = nn.Linear(D, D, bias=False)
        self.kv_cache = None

    def forward(self, x, freqs_cis, mask, input_pos):
        B, T, _ = x.shape
        kv = KV_HEADS * HEAD_DIM
        q, k, v = self.wqkv(x).split([D, kv, kv], -1)
        q = rotate(q.view(B, T, HEADS, HEAD_DIM), freqs_cis).transpose(1, 2)
        k = rotate(k.view(B, T, KV_HEADS, HEAD_DIM), freqs_cis).transpose(1, 2)
        v = v.view(B, T, KV_HEADS, HEAD_DIM).transpose(1, 2)
        if self.kv_cache is not None:
            k, v = self.kv_cache.update(input_pos, k, v)
        k, v = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(y.transpose(1, 2).reshape(B, T, D))


def rotate(x, freqs_cis):
    """x (B, T, h, d) times the complex table's rows (T, d/2), pairs of channels as complex numbers."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs_cis[None, :, None]).flatten(3).type_as(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = Attention()
        self.feed_forward = nn.Sequential(nn.Linear(D, 4 * D, bias=False), nn.SiLU(), nn.Linear(4 * D, D, bias=False))
        self.attention_norm, self.ffn_norm = nn.RMSNorm(D), nn.RMSNorm(D)

    def forward(self, x, input_pos, freqs_cis, mask):
        h = x + self.attention(self.attention_norm(x), freqs_cis, mask, input_pos)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, bug=None):
        super().__init__()
        self.bug = bug
        self.tok_embeddings = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm, self.output = nn.RMSNorm(D), nn.Linear(D, VOCAB, bias=False)
        self.freqs_cis = None
        self.max_batch_size = self.max_seq_length = -1

    def setup_caches(self, max_batch_size, max_seq_length):
        if self.max_seq_length >= max_seq_length and self.max_batch_size >= max_batch_size:
            return
        max_seq_length = -(-max_seq_length // 8) * 8
        self.max_seq_length, self.max_batch_size = max_seq_length, max_batch_size
        for b in self.layers:
            b.attention.kv_cache = KVCache(max_batch_size, max_seq_length, KV_HEADS, HEAD_DIM, self.output.weight.dtype)
        inv = 1.0 / 10000 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
        self.freqs_cis = torch.polar(torch.ones(max_seq_length, HEAD_DIM // 2),
                                     torch.arange(max_seq_length, dtype=torch.float32)[:, None] * inv)
        self.causal_mask = torch.tril(torch.ones(max_seq_length, max_seq_length, dtype=torch.bool))

    def forward(self, idx, input_pos=None):
        assert self.freqs_cis is not None, "Caches must be initialized first"
        T = idx.shape[1]
        mask = self.causal_mask[None, None, :T] if self.bug == "cache_top_left" else self.causal_mask[None, None, input_pos]
        freqs_cis = self.freqs_cis[:T] if self.bug == "cache_positions_from_zero" else self.freqs_cis[input_pos]
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, input_pos, freqs_cis, mask)
        return self.output(self.norm(x))


def build(bug=None, seed=0):
    return built(Transformer, bug, PLANTED, seed)


def cached(model, ids, n_new):
    """generate.py's way: set up the caches, prefill at input_pos 0..P-1, then the new tokens at P..T-1."""
    P, T = ids.shape[1] - n_new, ids.shape[1]
    model.setup_caches(ids.shape[0], T)
    model(ids[:, :P], torch.arange(P))
    return model(ids[:, P:], torch.arange(P, T))


__getattr__ = factories(build, PLANTED)
