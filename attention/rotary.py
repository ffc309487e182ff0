"""Rotary position embeddings (Su et al. 2021, GPT-NeoX's half-split layout).

Each pair (x_i, x_{i + d/2}) of a head's q and k is rotated by the phase position * inv_freq_i,
so q_m . k_n depends on m - n only. `rope_dtype` is the precision the phases are computed in:
in bfloat16 (8 significant bits) the position and the product are rounded, so the phase error
grows with the position (gpt-neox #1003, transformers #29496, Wang et al. 2024 arXiv 2411.13476).
"""
import torch

ROPE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ROPE_BASE = 10000.0


def inv_freq(d: int, base: float = ROPE_BASE) -> torch.Tensor:
    """(d/2,) float32: the angular frequency of each rotated pair."""
    return 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)


def rope_phases(positions: torch.Tensor, d: int, dtype: str = "float32") -> torch.Tensor:
    """positions (..., T) -> phases (..., T, d/2) in float32, computed in `dtype` (the bug:
    bfloat16 rounds the position and the product, as `t.type_as(inv_freq)` under half did)."""
    dt = ROPE_DTYPES[dtype]
    f = inv_freq(d).to(positions.device)
    return (positions.to(dt)[..., None] * f.to(dt)).float()


def apply_rope(x: torch.Tensor, phases: torch.Tensor) -> torch.Tensor:
    """x (B, h, T, d); phases (T, d/2) or (B, T, d/2): each pair (x_i, x_{i+d/2}) rotated."""
    if phases.dim() == 3:
        phases = phases[:, None]                     # (B, 1, T, d/2): broadcast over heads
    cos, sin = phases.cos().to(x.dtype), phases.sin().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
