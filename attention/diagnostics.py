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


def saved_tensor_bytes(forward, params=(), T: int | None = None):
    """Bytes autograd saves for backward while `forward()` runs: the activation memory of a step,
    each storage counted once, `params` excluded. Returns (forward's output, {"total", "square"}),
    square: the storages of (..., T, T) non-boolean tensors (the attention weights)."""
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, tuple[int, bool]] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in skip:
            sq = T is not None and t.dim() >= 2 and t.shape[-2:] == (T, T) and t.dtype != torch.bool
            seen[s.data_ptr()] = (s.nbytes(), seen.get(s.data_ptr(), (0, False))[1] or sq)
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    return out, {"total": sum(b for b, _ in seen.values()), "square": sum(b for b, sq in seen.values() if sq)}


def attention_matrix_bytes(batch: int, n_heads: int, t: int, bytes_per: int) -> int:
    """One layer's weights saved for backward by the explicit path: B * h * T^2 * bytes."""
    return batch * n_heads * t * t * bytes_per


def example_0(weights: torch.Tensor) -> torch.Tensor:
    """A float16 copy of example 0's weights: weights[0] alone is a view of the whole batch."""
    return weights[0].detach().to(device="cpu", dtype=torch.float16, copy=True)


class Recorder:
    """The one way into a layer's internals: set `layer.recorder = Recorder(...)` for a forward.

    A layer holding no recorder (the default) computes nothing extra and may run the fused SDPA
    kernel; a recorder that needs the weights sends the layer down the explicit path.
      stats          per-layer statistics of scores and weights (`stats`), and after backward the
                     "saturation gradient" mean |dL/dscores| (`collect_grads`); the scores tensor
                     is kept only to read its gradient
      keep_weights   example 0's weights per layer (`weights`: {layer: (h, T_q, T_k)}), for heatmaps
      check_finite   names of the layers whose weights were not finite, in the order met (`nonfinite`)
      capture_weights  every call's full weights, detached (`captured`: [(layer, (B, h, T_q, T_k))])
      capture_inputs   every call's inputs (`inputs`: [(module, args, kwargs)]), to rerun a layer alone
    """

    def __init__(self, stats: bool = True, keep_weights: bool = False, check_finite: bool = False,
                 capture_weights: bool = False, capture_inputs: bool = False):
        self.keep_stats, self.keep_weights, self.check_finite = stats, keep_weights, check_finite
        self.capture_weights, self.capture_inputs = capture_weights, capture_inputs
        self.stats: dict[str, float] = {}
        self.weights: dict[str, torch.Tensor] = {}
        self.nonfinite: list[str] = []
        self.captured: list[tuple[str, torch.Tensor]] = []
        self.inputs: list[tuple] = []
        self._scores: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}

    @property
    def needs_weights(self) -> bool:
        return self.keep_stats or self.keep_weights or self.check_finite or self.capture_weights

    def record_inputs(self, layer, args: tuple, kwargs: dict):
        if self.capture_inputs:
            self.inputs.append((layer, args, kwargs))

    @torch.no_grad()
    def record(self, name, q, k, scores, weights, mask, out=None, v=None, scale=1.0):
        if self.check_finite and not torch.isfinite(weights).all():
            self.nonfinite.append(name)
        if self.capture_weights:
            self.captured.append((name, weights.detach()))
        if self.keep_stats:
            self._record_stats(name, q, k, scores, weights, mask, out, v, scale)
        elif self.keep_weights:
            self.weights[name] = example_0(weights)

    def _record_stats(self, name, q, k, scores, weights, mask, out, v, scale):
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
        if self.keep_weights:
            self.weights[name] = example_0(w)
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
