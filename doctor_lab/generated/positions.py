"""Positions: rotary (real cos/sin or a complex freqs_cis table), ALiBi's bias, and the learned
table's ids. rope_bf16 computes the phases in bfloat16, in either rotary notation."""
import torch

MAX_POS = 4160      # the doctor shifts positions by 4096 at T = 16 (long_positions)


def inverse_frequencies(head_dim, dtype=torch.float32):
    return (1.0 / 10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)).to(dtype)


def freqs_cis(head_dim, bug, end=MAX_POS):
    """Meta's complex table (end, head_dim / 2): e^(i pos theta); phases in bfloat16 for rope_bf16."""
    dt = torch.bfloat16 if bug == "rope_bf16" else torch.float32
    phases = torch.outer(torch.arange(end).to(dt), inverse_frequencies(head_dim, dt)).float()
    return torch.polar(torch.ones_like(phases), phases)


def rotate(x, pos, kind, bug, table=None):
    """x (B, h, T, d) at positions pos (B|1, T); kind rope_real or rope_complex (else x unchanged)."""
    if kind == "rope_real":
        dt = torch.bfloat16 if bug == "rope_bf16" else torch.float32
        ph = (pos.to(dt)[..., None] * inverse_frequencies(x.shape[-1], dt).to(x.device)).float()[:, None]
        half = x.shape[-1] // 2
        a, b = x[..., :half].float(), x[..., half:].float()
        return torch.cat([a * ph.cos() - b * ph.sin(), a * ph.sin() + b * ph.cos()], -1).to(x.dtype)
    if kind == "rope_complex":
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * table[pos][:, None]).flatten(3).to(x.dtype)
    return x


def alibi_slopes(heads):
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)])


def alibi(slopes, q_start, t_q, t_k):
    """(1, H, t_q, t_k): -slope_h (i - j), query i at index q_start + i, key j at index j."""
    dist = (torch.arange(t_q) + q_start)[:, None] - torch.arange(t_k)[None, :]
    return -(slopes[:, None, None] * dist.float())[None]


def first_real(pad, T):
    """(B, T) positions counted from each row's first real token (0..T-1 where pad is None)."""
    if pad is None:
        return torch.arange(T)[None]
    return (pad.long().cumsum(-1) - 1).clamp(min=0)
