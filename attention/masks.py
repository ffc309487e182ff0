"""Masks are boolean with True = this key may be attended to."""
import torch

MASK_MODES = ("correct", "broadcast_bug")
MASK_FILLS = ("finite", "neg_inf")
CAUSAL_ALIGNS = ("lower_right", "top_left")


def causal_mask(t_q: int, t_k: int | None = None, device=None, align: str = "lower_right") -> torch.Tensor:
    """(T_q, T_k): query i sees keys j <= i (+ offset when T_k > T_q, as in decoding).
    align="top_left" drops the offset, as SDPA's is_causal does when T_q != T_k (pytorch #108108):
    a query decoded after a cache sees only the first keys."""
    t_k = t_q if t_k is None else t_k
    offset = t_k - t_q if align == "lower_right" else 0
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=offset)


def padding_mask(lengths: torch.Tensor, t: int, left: bool = True) -> torch.Tensor:
    """(B, T): True on real tokens. Left padding puts the real tokens at the end."""
    pos = torch.arange(t, device=lengths.device)
    if left:
        return pos[None, :] >= (t - lengths)[:, None]
    return pos[None, :] < lengths[:, None]


def expand_padding_mask(mask_bt: torch.Tensor) -> torch.Tensor:
    """(B, T_k) -> (B, 1, 1, T_k): broadcasts over heads and queries."""
    return mask_bt[:, None, None, :]


def combine_masks(attn_mask, key_padding_mask, mode: str = "correct"):
    """One (.., T_q, T_k) boolean mask from a causal/attention mask and a (B, T_k) padding mask.

    mode="broadcast_bug" passes the padding mask unexpanded: broadcasting right-aligns it
    as (1, 1, B, T_k), i.e. row b of the padding mask lands on *query* b of every example.
    When B == T_q that is silently wrong; otherwise broadcasting raises.
    """
    if key_padding_mask is None:
        return attn_mask
    pad = expand_padding_mask(key_padding_mask) if mode == "correct" else key_padding_mask
    return pad if attn_mask is None else attn_mask & pad


def fill_value(scores: torch.Tensor, mask_fill: str) -> float:
    """-inf leaves a row with no visible key as exp(-inf)/0 = NaN; the largest finite
    negative number turns such a row into a harmless uniform average."""
    return float("-inf") if mask_fill == "neg_inf" else torch.finfo(scores.dtype).min
