"""The variance argument as numbers: the std of a W_q / W_k entry each init scheme gives, the
multiplier each `scale` puts on the scores, and the score std at init they predict.

Plain Python, no torch: lm.py and mha.py initialise from these, and the report predicts from
the same functions (importing `attention.variance` loads no torch).
"""
import math

GPT2_STD = 0.02  # GPT-2's N(0, 0.02) for every Linear and Embedding weight


def qk_weight_std(init: str, d_model: int) -> float:
    """Std of a W_q / W_k entry at init: gpt2 N(0, 0.02); unit_variance N(0, 1/d_model), which
    gives q and k components of variance 1 on LayerNorm'd inputs (the variance argument's
    premise); torch_default U(+-1/sqrt(fan_in)), whose std is 1/sqrt(3 fan_in)."""
    return {"gpt2": GPT2_STD, "unit_variance": 1.0 / math.sqrt(d_model),
            "torch_default": 1 / math.sqrt(3 * d_model)}[init]


def initial_score_scale(scale, score: str, d_k: int) -> float:
    """The multiplier on the scores at init. `learned` starts where the score std is ~1: at
    1/sqrt(d_k) for dot-product-like scores, at sqrt(d_k) for cosine scores (std ~1/sqrt(d_k))."""
    if scale == "sqrt_dk":
        return 1.0 / math.sqrt(d_k)
    if scale == "none":
        return 1.0
    if scale == "learned":
        return math.sqrt(d_k) if score == "cosine" else 1 / math.sqrt(d_k)
    return float(scale)


def predicted_score_std(init: str, d_model: int, d_k: int, qk_gain: float, scale, score: str = "dot") -> float:
    """q = W_q x with x LayerNorm'd (unit variance per component) has components of std
    s = w gain sqrt(d_model) (biases ignored); q.k sums d_k products of std s^2, so
    std(q.k) = sqrt(d_k) s^2, times the scale. Cosine scores divide q and k by their norms
    (sqrt(d_k) s each): std 1/sqrt(d_k), times the scale."""
    s = qk_weight_std(init, d_model) * qk_gain * math.sqrt(d_model)
    raw = 1 / math.sqrt(d_k) if score == "cosine" else math.sqrt(d_k) * s * s
    return raw * initial_score_scale(scale, score, d_k)
