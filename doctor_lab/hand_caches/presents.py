"""`forward(idx, past_key_values=None, use_cache=False) -> (logits, presents)` outside transformers,
as hand-written GPT-2 forks, AllenAI's OLMo and DeepSeek-V2-style latent attention write it (read,
not copied): the positions of the new tokens count on from the past's length, and the presents come
back per layer as

- "kv": (k, v), each (B, H, T, d), in a tuple (logits, presents);
- "latent": (the compressed latent (B, T, d_c), the shared rope key (B, T, 1, d_r)): keys and values
  are expanded from the latent in every call (multi-head latent attention's naive path);
- "olmo": (k, v) in a NamedTuple (logits, attn_key_values, hidden_states), the presents None unless
  use_cache.

Planted (in every layout): the new tokens' positions counted from 0 instead of the past's length,
and a top-left causal mask on the step. Factories: `LAYOUT_healthy`, `LAYOUT_BUG`."""
import functools
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from doctor_lab.hand_caches._parts import HEAD_DIM, HEADS, LAYERS, VOCAB, D, built, new_rows, rope

PLANTED = {
    "cache_positions_from_zero": "the new tokens' rotary positions start at 0, not at the past's length",
    "cache_top_left": "the step's mask has query i at key i (top-left), not after the past keys",
}
LAYOUTS = ("kv", "latent", "olmo")
LATENT, ROPE_DIM = 8, 4


class OLMoOutput(NamedTuple):
    logits: torch.Tensor
    attn_key_values: list | None
    hidden_states: tuple | None


class Attention(nn.Module):
    def __init__(self, layout, bug):
        super().__init__()
        self.layout, self.bug = layout, bug
        if layout == "latent":
            self.q = nn.Linear(D, HEADS * (HEAD_DIM + ROPE_DIM), bias=False)
            self.kv_down = nn.Linear(D, LATENT, bias=False)
            self.k_rope = nn.Linear(D, ROPE_DIM, bias=False)
            self.kv_up = nn.Linear(LATENT, HEADS * 2 * HEAD_DIM, bias=False)
        else:
            self.qkv = nn.Linear(D, 3 * D, bias=False)
        self.out = nn.Linear(D, D, bias=False)

    def forward(self, x, positions, past):
        B, T, _ = x.shape
        if self.layout == "latent":
            q = self.q(x).view(B, T, HEADS, HEAD_DIM + ROPE_DIM)
            q = torch.cat([q[..., :HEAD_DIM], rope(q[..., HEAD_DIM:], positions)], -1)
            latent, k_rope = self.kv_down(x), rope(self.k_rope(x)[:, :, None], positions)
            if past is not None:
                latent, k_rope = torch.cat([past[0], latent], 1), torch.cat([past[1], k_rope], 1)
            present = (latent, k_rope)
            L = latent.shape[1]
            k_nope, v = self.kv_up(latent).view(B, L, HEADS, 2 * HEAD_DIM).split(HEAD_DIM, -1)
            k = torch.cat([k_nope, k_rope.expand(B, L, HEADS, ROPE_DIM)], -1)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        else:
            q, k, v = self.qkv(x).view(B, T, 3, HEADS, HEAD_DIM).unbind(2)
            q, k, v = rope(q, positions).transpose(1, 2), rope(k, positions).transpose(1, 2), v.transpose(1, 2)
            if past is not None:
                k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
            present = (k, v)
        keep = new_rows(T, k.shape[2], top_left=self.bug == "cache_top_left", device=x.device)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.out(y.transpose(1, 2).reshape(B, T, D)), present


class Block(nn.Module):
    def __init__(self, layout, bug):
        super().__init__()
        self.attn = Attention(layout, bug)
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x, positions, past):
        a, present = self.attn(self.ln1(x), positions, past)
        x = x + a
        return x + self.mlp(self.ln2(x)), present


class LM(nn.Module):
    def __init__(self, layout="kv", bug=None):
        super().__init__()
        self.layout, self.bug = layout, bug
        self.wte = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(Block(layout, bug) for _ in range(LAYERS))
        self.ln_f, self.head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx, past_key_values=None, use_cache=False):
        T = idx.shape[1]
        past_length = 0 if past_key_values is None else past_key_values[0][0].shape[-2 if self.layout != "latent" else 1]
        start = 0 if self.bug == "cache_positions_from_zero" else past_length
        positions = torch.arange(start, start + T, device=idx.device)
        x, presents = self.wte(idx), []
        for i, block in enumerate(self.blocks):
            x, present = block(x, positions, None if past_key_values is None else past_key_values[i])
            presents.append(present)
        logits = self.head(self.ln_f(x))
        if self.layout == "olmo":
            return OLMoOutput(logits, presents if use_cache else None, None)
        return logits, tuple(presents)


def build(layout, bug=None, seed=0):
    return built(lambda b: LM(layout, b), bug, PLANTED, seed)


def cached(model, ids, n_new):
    """The prompt with use_cache=True, then the new tokens with its presents."""
    out = model(ids[:, :-n_new], use_cache=True)
    return model(ids[:, -n_new:], past_key_values=out[1], use_cache=True)[0]


def __getattr__(name):
    layout, _, what = name.partition("_")
    if layout in LAYOUTS and (what == "healthy" or what in PLANTED):
        return functools.partial(build, layout, None if what == "healthy" else what)
    raise AttributeError(name)
