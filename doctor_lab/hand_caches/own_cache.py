"""nanochat's manner (karpathy/nanochat gpt.py and engine.py, read, not copied): a config dataclass,
grouped query heads, rotary tables sliced at the cache's position, a token shift ("smear": each
token takes a gated share of the previous token's embedding), and `forward(idx, targets=None,
kv_cache=None)` taking a cache object of the model's own class, `KVCache(batch_size, num_heads,
seq_len, head_dim, num_layers, device, dtype)`, which the caller builds (its num_heads the key/value
heads) and the last layer advances. Without a cache the attention is causal over the sequence;
with one, the new queries read every cached key before them.

Planted: nanochat#756 (open): a step of several tokens after the prefill smears as a prefill does,
its first token without its predecessor (the cache's last embedding); and a top-left causal mask
on the step (is_causal over the new rows)."""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from doctor_lab.hand_caches._parts import (
    HEADS,
    KV_HEADS,
    LAYERS,
    MAX_LEN,
    VOCAB,
    D,
    built,
    factories,
    new_rows,
)

PLANTED = {
    "chunk_smear": "a multi-token step smears as a prefill: its first token misses the cached predecessor "
                   "(karpathy/nanochat#756)",
    "cache_top_left": "the step's mask has query i at key i (top-left), not after the cached keys",
}


@dataclass
class GPTConfig:
    sequence_len: int = MAX_LEN
    vocab_size: int = VOCAB
    n_layer: int = LAYERS
    n_head: int = HEADS
    n_kv_head: int = KV_HEADS
    n_embd: int = D


class KVCache:
    """Every layer's keys and values (n_layers, B, T, H_kv, d), one position for the batch, and the
    last token's embedding (the smear's predecessor for the next step)."""

    def __init__(self, batch_size, num_heads, seq_len, head_dim, num_layers, device, dtype):
        self.k = torch.zeros(num_layers, batch_size, seq_len, num_heads, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.n_layers, self.pos, self.prev_embedding = num_layers, 0, None

    def write(self, layer, k, v):
        """Store the new keys and values at the position; every key so far."""
        end = self.pos + k.shape[1]
        self.k[layer, :, self.pos:end], self.v[layer, :, self.pos:end] = k, v
        return self.k[layer, :, :end], self.v[layer, :, :end]


def norm(x):
    return F.rms_norm(x, (x.shape[-1],))


def rotate(x, cos, sin):
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], -1)


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer_idx, bug):
        super().__init__()
        self.layer_idx, self.bug = layer_idx, bug
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.n_embd // config.n_head
        self.c_q = nn.Linear(config.n_embd, self.n_head * self.head_dim, bias=False)
        self.c_k = nn.Linear(config.n_embd, self.n_kv_head * self.head_dim, bias=False)
        self.c_v = nn.Linear(config.n_embd, self.n_kv_head * self.head_dim, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x, cos_sin, kv_cache):
        B, T, C = x.shape
        q = rotate(self.c_q(x).view(B, T, self.n_head, self.head_dim), *cos_sin)
        k = rotate(self.c_k(x).view(B, T, self.n_kv_head, self.head_dim), *cos_sin)
        v = self.c_v(x).view(B, T, self.n_kv_head, self.head_dim)
        if kv_cache is None:
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True, enable_gqa=True)
        else:
            k, v = kv_cache.write(self.layer_idx, k, v)
            keep = new_rows(T, k.shape[1], top_left=self.bug == "cache_top_left", device=x.device)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               attn_mask=keep, enable_gqa=True)
            if self.layer_idx == kv_cache.n_layers - 1:
                kv_cache.pos += T
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, config, layer_idx, bug):
        super().__init__()
        self.attn = CausalSelfAttention(config, layer_idx, bug)
        self.mlp = nn.Sequential(nn.Linear(config.n_embd, 4 * config.n_embd, bias=False), nn.ReLU(),
                                 nn.Linear(4 * config.n_embd, config.n_embd, bias=False))

    def forward(self, x, cos_sin, kv_cache):
        x = x + self.attn(norm(x), cos_sin, kv_cache)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    def __init__(self, config, bug=None):
        super().__init__()
        self.config, self.bug = config, bug
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.h = nn.ModuleList(Block(config, i, bug) for i in range(config.n_layer))
        self.smear_gate = nn.Linear(config.n_embd, 1, bias=False)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        d = config.n_embd // config.n_head
        inv = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        ph = torch.arange(config.sequence_len, dtype=torch.float32)[:, None] * inv
        self.register_buffer("cos", ph.cos()[None, :, None, :], persistent=False)
        self.register_buffer("sin", ph.sin()[None, :, None, :], persistent=False)

    def smear(self, x, before):
        """Each token plus a gated share of the one before it (`before`: the first token's, or None)."""
        prev = x[:, :-1] if before is None else torch.cat([before, x[:, :-1]], 1)
        gate = torch.sigmoid(self.smear_gate(x[:, -prev.shape[1]:]))
        return torch.cat([x[:, : x.shape[1] - prev.shape[1]], x[:, -prev.shape[1]:] + gate * prev], 1)

    def forward(self, idx, targets=None, kv_cache=None):
        B, T = idx.shape
        T0 = 0 if kv_cache is None else kv_cache.pos
        cos_sin = self.cos[:, T0:T0 + T], self.sin[:, T0:T0 + T]
        x = norm(self.wte(idx))
        if kv_cache is None:
            x = self.smear(x, None)
        else:
            before = kv_cache.prev_embedding
            kv_cache.prev_embedding = x[:, -1:]
            if T > 1 and self.bug == "chunk_smear":
                before = None   # nanochat#756: a chunk is smeared as a prefill
            x = self.smear(x, before)
        for block in self.h:
            x = block(x, cos_sin, kv_cache)
        logits = self.lm_head(norm(x))
        if targets is not None:
            return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits


def build(bug=None, seed=0):
    return built(lambda b: GPT(GPTConfig(), b), bug, PLANTED, seed)


def cached(model, ids, n_new):
    """engine.py's way: a cache built by the caller, the prompt, then the new tokens."""
    c = model.config
    cache = KVCache(ids.shape[0], c.n_kv_head, ids.shape[1], c.n_embd // c.n_head, c.n_layer, ids.device, torch.float32)
    model(ids[:, :-n_new], kv_cache=cache)
    return model(ids[:, -n_new:], kv_cache=cache)


__getattr__ = factories(build, PLANTED)
