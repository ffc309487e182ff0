"""Pure functions over scores and weights, and the recorder layers publish through.

All reductions run over valid (unmasked) entries only; weights are (B, h, T_q, T_k).
"""
import math

import torch

SATURATED = 0.99  # a row whose max weight exceeds this passes almost no gradient to the others


def entropy(weights: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Entropy per row in nats: ln(T_k) for uniform attention, 0 for one-hot."""
    w = weights.clamp_min(eps)
    return -(weights * w.log()).sum(-1)


def max_weight(weights: torch.Tensor) -> torch.Tensor:
    return weights.max(-1).values


def saturated_fraction(weights: torch.Tensor, threshold: float = SATURATED) -> torch.Tensor:
    return (max_weight(weights) > threshold).float().mean()


def masked_std(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Std of the scores the softmax actually competes over (masked entries excluded)."""
    if mask is None:
        return scores.float().std()
    return scores.float().masked_select(mask.expand_as(scores)).std()


def masked_max_abs(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    s = scores.float().abs()
    if mask is not None:
        s = s.masked_fill(~mask.expand_as(s), 0.0)
    return s.max()


def softmax_jacobian_diag(weights: torch.Tensor) -> torch.Tensor:
    """d alpha_i / d s_i = alpha_i (1 - alpha_i): vanishes as a row saturates."""
    return weights * (1 - weights)


def negative_fraction(weights: torch.Tensor) -> torch.Tensor:
    return (weights < 0).float().mean()


def hull_violation(out: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """How far outputs leave the per-coordinate range of the values they mix (0 inside the
    convex hull's bounding box; a convex combination can never leave it).
    out: (B, h, T_q, d_v), values: (B, h, T_k, d_v)."""
    lo = values.min(dim=-2, keepdim=True).values
    hi = values.max(dim=-2, keepdim=True).values
    return (torch.relu(lo - out) + torch.relu(out - hi)).amax(-1).mean()


def kv_cache_bytes(n_layers: int, n_kv_heads: int, d_k: int, t: int, bytes_per: int,
                   batch: int = 1, d_v: int | None = None) -> int:
    """Keys and values for every layer: 2 * layers * n_kv_heads * d_k * T * bytes (per sequence)."""
    d_v = d_k if d_v is None else d_v
    return batch * n_layers * n_kv_heads * (d_k + d_v) * t * bytes_per


def attention_matrix_bytes(batch: int, n_heads: int, t: int, bytes_per: int) -> int:
    """One layer's weights saved for backward by the explicit path: B * h * T^2 * bytes."""
    return batch * n_heads * t * t * bytes_per


class Recorder:
    """Collects per-layer attention statistics on diagnostic steps.

    A layer holding no recorder (the default) computes nothing extra. Forward statistics are
    reduced at once; the scores tensor is kept only to read its gradient after backward,
    the "saturation gradient" mean |dL/dscores|.
    """

    def __init__(self, keep_weights: bool = False):
        self.keep_weights = keep_weights
        self.stats: dict[str, float] = {}
        self.weights: dict[str, torch.Tensor] = {}
        self._scores: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}

    @torch.no_grad()
    def record(self, name, q, k, scores, weights, mask, out=None, v=None, scale=1.0):
        valid = None if mask is None else mask.expand_as(weights)
        w = weights.detach().float()
        rows = entropy(w)
        row_max = max_weight(w)
        if valid is not None:  # rows with no visible key carry no information
            live = valid.any(-1)
            rows, row_max = rows[live], row_max[live]
        per_head_entropy = entropy(w).mean(dim=(0, 2))
        s = {
            "entropy": rows.mean(),
            "max_weight": row_max.mean(),
            "saturated": (row_max > SATURATED).float().mean(),
            "score_std": masked_std(scores.detach(), mask),
            "max_score": masked_max_abs(scores.detach(), mask),
            "q_std": q.detach().float().std(),
            "k_std": k.detach().float().std(),
            "negative_weights": negative_fraction(w if valid is None else w.masked_select(valid)),
        }
        # The variance argument: q.k sums d_k products of std(q) std(k), times the scale.
        s["score_std_pred"] = math.sqrt(q.shape[-1]) * s["q_std"] * s["k_std"] * scale
        if out is not None and v is not None:
            s["hull_violation"] = hull_violation(out.detach().float(), v.detach().float())
        for key, val in s.items():
            self.stats[f"attn/{key}/{name}"] = float(val)
        for h, val in enumerate(per_head_entropy.tolist()):
            self.stats[f"attn/entropy_head/{name}/H{h}"] = val
        if self.keep_weights:  # a float16 copy of example 0: w[0] alone is a view of the whole batch
            self.weights[name] = w[0].to(device="cpu", dtype=torch.float16, copy=True)
        if scores.requires_grad:
            scores.retain_grad()
            self._scores[name] = (scores, mask)

    def collect_grads(self) -> dict[str, float]:
        """Call after backward: mean |dL/dscores| over valid entries, per layer."""
        for name, (scores, mask) in self._scores.items():
            if scores.grad is None:
                continue
            g = scores.grad.abs()
            val = g.masked_select(mask.expand_as(g)).mean() if mask is not None else g.mean()
            self.stats[f"grad/scores/{name}"] = float(val)
        self._scores.clear()
        return self.stats
