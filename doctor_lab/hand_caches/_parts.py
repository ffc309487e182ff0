"""What the hand-written caches share: the tiny size, rotary positions, the causal rows of new
queries over a cache, and the command line's factories (the styles bed's)."""

import torch

from doctor_lab.styles._common import factories  # noqa: F401 (re-exported: each model file's __getattr__)

VOCAB, D, HEADS, KV_HEADS, LAYERS = 32, 16, 4, 2, 2
HEAD_DIM = D // HEADS
MAX_LEN = 4160   # the doctor shifts positions by 4096 at T = 16 (long_positions)


def rope(x, positions, base=10000.0):
    """x (B, T, h, d) rotated by positions (T,): the half-rotation layout, in float32."""
    d = x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ph = positions.float()[:, None] * inv                 # (T, d/2)
    cos, sin = ph.cos()[None, :, None], ph.sin()[None, :, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).to(x.dtype)


def new_rows(n_new, n_keys, top_left=False, device=None):
    """(n_new, n_keys) bool, True = may attend: the new queries sit after the cached keys
    (lower-right aligned); top_left puts query i at key i, as is_causal=True does on a step."""
    q = torch.arange(n_new, device=device)[:, None] + (0 if top_left else n_keys - n_new)
    return torch.arange(n_keys, device=device)[None, :] <= q


def built(make, bug, planted, seed=0):
    """make(bug) seeded, in eval mode; a bug the module does not plant is an error."""
    if bug is not None and bug not in planted:
        raise ValueError(f"not planted here: {bug!r} (planted: {', '.join(planted)})")
    torch.manual_seed(seed)
    return make(bug).eval()
