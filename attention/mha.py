"""Multi-head attention with one keyword per failure mode.

The explicit path (scores -> softmax -> weights @ V) is the reference and the only one that
can show its weights; the SDPA path is the fused kernel for whatever it can express.
A Recorder (attention.diagnostics) is the one way in: set `layer.recorder` to see statistics,
weights or inputs of a forward.
"""
import math
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention.config import AttentionConfig
from attention.diagnostics import Recorder
from attention.logit_fixes import SigmaReparamLinear, qk_clip_factors, softcap
from attention.masks import additive, apply_mask, attention_mask, causal_mask, fill_value, visible
from attention.rotary import apply_rope, rope_phases
from attention.scoring import SCORINGS
from attention.softmax import SOFTMAXES
from attention.variance import initial_score_scale

__all__ = ["AttentionConfig", "KVCache", "MultiHeadAttention"]


class KVCache:
    """Keys and values of the tokens decoded so far, per layer: (B, n_kv_heads, T, d_k | d_v)."""

    def __init__(self, n_layers: int):
        self.k: list[torch.Tensor | None] = [None] * n_layers
        self.v: list[torch.Tensor | None] = [None] * n_layers

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        if self.k[layer] is not None:
            k = torch.cat([self.k[layer], k], dim=2)
            v = torch.cat([self.v[layer], v], dim=2)
        self.k[layer], self.v[layer] = k, v
        return k, v

    @property
    def length(self) -> int:
        return 0 if self.k[0] is None else self.k[0].shape[2]

    def nbytes(self) -> int:
        return sum(t.nelement() * t.element_size() for t in self.k + self.v if t is not None)


class MultiHeadAttention(nn.Module):
    def __init__(self, cfg: AttentionConfig | None = None, **overrides):
        super().__init__()
        if cfg is None:
            cfg = AttentionConfig(**overrides)
        elif overrides:
            cfg = AttentionConfig(**{**cfg.__dict__, **overrides})
        self.cfg = cfg
        h, h_kv, d_k, d_v = cfg.n_heads, cfg.n_kv_heads, cfg.d_k, cfg.d_v
        self.n_heads, self.n_kv_heads, self.d_k, self.d_v = h, h_kv, d_k, d_v
        Linear = SigmaReparamLinear if cfg.sigma_reparam else nn.Linear
        self.W_q = Linear(cfg.d_model, h * d_k, bias=cfg.bias)
        self.W_k = Linear(cfg.d_model, h_kv * d_k, bias=cfg.bias)
        self.W_v = Linear(cfg.d_model, h_kv * d_v, bias=cfg.bias)
        self.W_o = Linear(h * d_v, cfg.d_model, bias=cfg.bias)
        if cfg.qk_norm:
            self.q_norm, self.k_norm = nn.LayerNorm(d_k), nn.LayerNorm(d_k)
        self.scoring = SCORINGS[cfg.score]
        for name, p in self.scoring.params(h, d_k).items():
            self.register_parameter(name, p)
        if cfg.scale == "learned":  # one log-scale per head, started where the score std is ~1
            self.log_scale = nn.Parameter(torch.full((h, 1, 1), math.log(initial_score_scale("learned", cfg.score, d_k))))
        self.name = "L0"          # set by the LM; names this layer's metrics
        self.layer_idx = 0
        self.recorder: Recorder | None = None  # off: a step without diagnostics pays nothing
        self.max_logit: torch.Tensor | None = None  # qk_clip: per-head max |score| since the last clip

    def scale_factor(self):
        """The multiplier on the scores: a float, or the learned per-head tensor."""
        if self.cfg.scale == "learned":
            return self.log_scale.exp()
        return initial_score_scale(self.cfg.scale, self.cfg.score, self.d_k)

    def split_heads(self, x, n, d):
        B, T, _ = x.shape
        return x.view(B, T, n, d).transpose(1, 2)  # (B, T, n d) -> (B, n, T, d)

    def scores(self, q, k):
        """(B, h, T_q, T_k) scaled scores; k already repeated to h heads. In float16, q @ k^T
        overflows to inf once |q.k| > 65504 even if the scaled score would not: upcast scales q
        first and computes in float32 (HF GPT-2's reorder_and_upcast_attn)."""
        if self.cfg.upcast:
            with torch.autocast(q.device.type, enabled=False):
                s = self.scoring.scores(self, q.float() * self.scale_factor(), k.float())
        else:
            s = self.scoring.scores(self, q, k) * self.scale_factor()
        return s if self.cfg.softcap is None else softcap(s, self.cfg.softcap)

    @torch.no_grad()
    def _track_max_logit(self, q, k, mask):
        """qk_clip: the running per-head max |score| of this step's forwards (one extra, gradient-free
        q k^T, so the fused kernel keeps running); k already repeated to h heads."""
        s = self.scores(q, k).abs()                                   # (B, h, T_q, T_k)
        if mask is not None:
            s = s.masked_fill(~mask, 0.0)
        m = s.float().amax(dim=(0, 2, 3))                             # (h,)
        self.max_logit = m if self.max_logit is None else torch.maximum(self.max_logit, m)

    @torch.no_grad()
    def qk_clip_(self) -> torch.Tensor | None:
        """QK-clip, called by the trainer after optimizer.step(): the rows (and biases) of W_q and
        W_k of each head whose max logit passed tau scaled by sqrt(tau / max logit), so that head's
        logits on the same inputs shrink to tau. Returns the max logits it acted on, and resets them."""
        m, self.max_logit = self.max_logit, None
        if self.cfg.qk_clip is None or m is None:
            return None
        f_q, f_k = qk_clip_factors(m, float(self.cfg.qk_clip), self.n_heads // self.n_kv_heads)
        for lin, f, d in ((self.W_q, f_q, self.d_k), (self.W_k, f_k, self.d_k)):
            rows = f.repeat_interleave(d).to(lin.weight.dtype)         # (heads * d_k,)
            lin.weight.mul_(rows[:, None])
            if lin.bias is not None:
                lin.bias.mul_(rows)
        return m

    def attend(self, q, k, v, mask=None):
        """The explicit path on heads: q (B, h, T_q, d_k), k (B, h, T_k, d_k), v (B, h, T_k, d_v),
        mask bool (True = attend) broadcastable to (B, h, T_q, T_k).
        Returns (out (B, h, T_q, d_v), weights (B, h, T_q, T_k) as applied to V)."""
        scores = self.scores(q, k)                                   # (B, h, T_q, T_k)
        if mask is not None and self.cfg.softmax == "sum":
            scores = scores.masked_fill(~visible(mask), 0.0)
        else:
            scores = apply_mask(scores, mask, self.cfg.mask_fill)
        with torch.autocast(scores.device.type, enabled=False) if self.cfg.upcast else nullcontext():
            weights = SOFTMAXES[self.cfg.softmax](scores, dim=-1)     # (B, h, T_q, T_k)
        mask = visible(mask)
        weights = F.dropout(weights, self.cfg.dropout, self.training)
        # upcast leaves the weights in float32; a float16 model (weights cast, no autocast) needs
        # them back in v's dtype (under autocast the matmul casts them the same way)
        out = weights.to(v.dtype) @ v                                 # (B, h, T_q, d_v)
        if self.recorder is not None:
            self.recorder.record(self.name, q, k, scores, weights, mask, out=out, v=v,
                                 scale=float(torch.as_tensor(self.scale_factor()).detach().mean()))
        return out, weights

    def _sdpa(self, q, k, v, mask, is_causal):
        """The fused kernel: what `attend` computes, for configs SDPA can express."""
        q, s = self.scoring.sdpa_q(self, q), self.scale_factor()
        if not isinstance(s, float):  # a learned scale is a tensor: fold it into q
            q, s = q * s, 1.0
        if mask is not None and mask.dtype == torch.bool:  # same fill as the explicit path: added
            mask = additive(mask, q.dtype, fill_value(q, self.cfg.mask_fill))
        elif mask is not None:  # already additive (mask_combine=add_min)
            mask = mask.to(q.dtype)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal and mask is None,
            dropout_p=self.cfg.dropout if self.training else 0.0, scale=s,
            enable_gqa=self.n_kv_heads != self.n_heads)

    def forward(self, query, key, value, mask=None, need_weights=False, *,
                key_padding_mask=None, is_causal=False, cache: KVCache | None = None, positions=None):
        """query (B, T_q, d_model), key/value (B, T_k, d_model); mask: bool, True = attend,
        broadcastable to (B, h, T_q, T_k); key_padding_mask: (B, T_k), expanded per mask_mode.
        positions: (T_q,) or (B, T_q) for rotary q and k (self-attention: the keys are the queries'
        tokens); None = counted on from the tokens this layer has cached.
        Returns (out (B, T_q, d_model), weights (B, h, T_q, T_k) as applied to V, or None)."""
        if self.recorder is not None:
            self.recorder.record_inputs(self, (query, key, value), dict(
                mask=mask, key_padding_mask=key_padding_mask, is_causal=is_causal, cache=cache, positions=positions))
        B, T_q, _ = query.shape
        q = self.split_heads(self.W_q(query), self.n_heads, self.d_k)     # (B, h, T_q, d_k)
        k = self.split_heads(self.W_k(key), self.n_kv_heads, self.d_k)    # (B, h_kv, T_k, d_k)
        v = self.split_heads(self.W_v(value), self.n_kv_heads, self.d_v)  # (B, h_kv, T_k, d_v)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.cfg.rope:  # rotated before they are cached or scored: a cached key keeps its phase
            if positions is None:
                start = 0 if cache is None or cache.k[self.layer_idx] is None else cache.k[self.layer_idx].shape[2]
                positions = torch.arange(start, start + T_q, device=query.device)
            phases = rope_phases(positions, self.d_k, self.cfg.rope_dtype)   # (.., T_q, d_k / 2)
            q, k = apply_rope(q, phases), apply_rope(k, phases)
        q, k = self.scoring.qk(q, k)
        if cache is not None:                                             # + the tokens decoded so far
            k, v = cache.append(self.layer_idx, k, v)                     # (B, h_kv, T_cache + T_k, d)
        T_k = k.shape[2]
        explicit = not self.cfg.use_sdpa or need_weights or (self.recorder is not None and self.recorder.needs_weights)
        mask, is_causal = attention_mask(self, T_q, T_k, mask, key_padding_mask, is_causal, fused=not explicit,
                                         device=query.device, dtype=q.dtype)
        if self.cfg.qk_clip is not None and self.training:
            group = self.n_heads // self.n_kv_heads
            seen = causal_mask(T_q, T_k, device=query.device) if is_causal else visible(mask)
            self._track_max_logit(q, k.repeat_interleave(group, 1) if group > 1 else k, seen)
        if explicit:
            if self.n_kv_heads != self.n_heads:  # query head i reads kv head i // group (as SDPA)
                group = self.n_heads // self.n_kv_heads
                k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # (B, h, T_k, d)
            out, weights = self.attend(q, k, v, mask)                     # (B, h, T_q, d_v)
        else:
            out, weights = self._sdpa(q, k, v, mask, is_causal), None     # (B, h, T_q, d_v)
        if self.cfg.merge == "correct":
            out = out.transpose(1, 2).reshape(B, T_q, self.n_heads * self.d_v)  # (B, T_q, h d_v)
        else:  # the bug: (B, h, T, d_v) flattened as if it were (B, T, h, d_v)
            out = out.reshape(B, T_q, self.n_heads * self.d_v)
        return self.W_o(out), (weights if need_weights else None)         # (B, T_q, d_model)
