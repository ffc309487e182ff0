"""Masks are boolean with True = this key may be attended to. `attention_mask` is the one place a
layer's mask is made: causal, reach and padding, combined as its config says."""
import torch

MASK_MODES = ("correct", "broadcast_bug")
MASK_FILLS = ("finite", "neg_inf", "minus_1e4", "add_minus_1e4")
CAUSALS = ("correct", "off_by_one")
CAUSAL_ALIGNS = ("lower_right", "top_left")
MASK_COMBINES = ("logical_and", "add_min")
REACHES = ("all", "self")
FILLS_AS_NEG_INF = ("finite", "neg_inf")  # fills that act as -inf on a row with a visible key (SDPA's causal flag)
MASKED_BIAS = -1e4  # GPT-2's masked_bias: replaced in by HF's port, added by the original TF code


def causal_mask(t_q: int, t_k: int | None = None, device=None, causal: str = "correct",
                align: str = "lower_right") -> torch.Tensor:
    """(T_q, T_k): query i sees keys j <= i (+ offset when T_k > T_q, as in decoding).
    causal="off_by_one" is the hand-written bug triu(diagonal=0): a token cannot see itself.
    align="top_left" drops the offset, as SDPA's is_causal does when T_q != T_k (pytorch #108108):
    a query decoded after a cache sees only the first keys."""
    t_k = t_q if t_k is None else t_k
    offset = t_k - t_q if align == "lower_right" else 0
    off = 1 if causal == "off_by_one" else 0
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=offset - off)


def self_mask(t_q: int, t_k: int | None = None, device=None) -> torch.Tensor:
    """(T_q, T_k): query i sees only its own key (lower-right aligned, as causal_mask): attention
    that cannot read other positions, so a model's loss with it is the no-attention floor."""
    t_k = t_q if t_k is None else t_k
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(t_k - t_q).triu(t_k - t_q)


def window_mask(t_q: int, t_k: int | None = None, window: int = 1, sinks: int = 0, device=None) -> torch.Tensor:
    """(T_q, T_k): what a sliding-window KV cache still holds for each query (lower-right aligned):
    its last `window` keys, its own included, and the first `sinks` keys. StreamingLLM (Xiao et
    al. 2023, arXiv 2309.17453): a model trained on whole prefixes parks attention on the first
    tokens (attention sinks); once they leave the window that weight has nowhere to go and the
    loss explodes; keeping the first 4 restores it."""
    t_k = t_q if t_k is None else t_k
    i = torch.arange(t_q, device=device)[:, None] + (t_k - t_q)   # each query's own position among the keys
    j = torch.arange(t_k, device=device)[None, :]
    return (i - j < window) | (j < sinks)


def serves_window(layer) -> bool:
    """A sliding-window KV cache holds part of the prefix: in evaluation and decoding only."""
    return layer.cfg.kv_window is not None and not layer.training


def kernel_causal(layer, t_q: int, t_k: int) -> bool:
    """SDPA's own causal flag (a -inf fill, aligned top-left) computes exactly the causal mask this
    layer asks for: a correct diagonal, nothing else hidden (reach=all, no KV window), a fill that
    acts as -inf, and an alignment that agrees (a square, or causal_align=top_left: the bug of
    handing T_q != T_k to the flag)."""
    cfg = layer.cfg
    return (cfg.causal == "correct" and cfg.reach == "all" and not serves_window(layer)
            and cfg.mask_fill in FILLS_AS_NEG_INF and (t_q == t_k or cfg.causal_align == "top_left"))


def attention_mask(layer, t_q: int, t_k: int, mask=None, key_padding_mask=None, is_causal: bool = False,
                   fused: bool = False, device=None, dtype=torch.float32):
    """The mask `layer` (its cfg: an AttentionConfig; `layer.training`) applies to (.., T_q, T_k)
    scores, and whether the fused kernel's own causal flag stands in for its causal part (fused:
    SDPA will run). Returns (mask or None, is_causal)."""
    cfg = layer.cfg
    if is_causal and fused and mask is None and key_padding_mask is None and kernel_causal(layer, t_q, t_k):
        return None, True
    if is_causal:
        causal = causal_mask(t_q, t_k, device=device, causal=cfg.causal, align=cfg.causal_align)  # (T_q, T_k)
        mask = causal if mask is None else mask & causal
    if cfg.reach == "self":  # the no-attention floor: nothing but the query's own key
        own = self_mask(t_q, t_k, device=device)
        mask = own if mask is None else mask & own
    if serves_window(layer):  # what a sliding-window KV cache still holds
        kept = window_mask(t_q, t_k, cfg.kv_window, cfg.kv_sinks, device=device)
        mask = kept if mask is None else mask & kept
    return combine_masks(mask, key_padding_mask, cfg.mask_mode, cfg.mask_combine, dtype), False  # broadcastable to (B, h, T_q, T_k)


def padding_mask(lengths: torch.Tensor, t: int, left: bool = True) -> torch.Tensor:
    """(B, T): True on real tokens. Left padding puts the real tokens at the end."""
    pos = torch.arange(t, device=lengths.device)
    if left:
        return pos[None, :] >= (t - lengths)[:, None]
    return pos[None, :] < lengths[:, None]


def expand_padding_mask(mask_bt: torch.Tensor) -> torch.Tensor:
    """(B, T_k) -> (B, 1, 1, T_k): broadcasts over heads and queries."""
    return mask_bt[:, None, None, :]


def combine_masks(attn_mask, key_padding_mask, mode: str = "correct", combine: str = "logical_and",
                  dtype=torch.float32):
    """One (.., T_q, T_k) boolean mask from a causal/attention mask and a (B, T_k) padding mask.

    combine="add_min" (transformers PR #17306) turns each mask into an additive one filled with
    finfo(dtype).min and adds them: where both mask a key, min + min overflows to -inf (any
    dtype); the result is a float mask that attention adds to the scores.

    mode="broadcast_bug" passes the padding mask unexpanded: broadcasting right-aligns it
    as (1, 1, B, T_k), i.e. row b of the padding mask lands on *query* b of every example.
    When B == T_q that is silently wrong; otherwise broadcasting raises.
    """
    if key_padding_mask is None:
        return attn_mask
    pad = expand_padding_mask(key_padding_mask) if mode == "correct" else key_padding_mask
    if combine == "add_min" and attn_mask is not None:
        return additive(attn_mask, dtype, torch.finfo(dtype).min) + additive(pad, dtype, torch.finfo(dtype).min)
    return pad if attn_mask is None else attn_mask & pad


def additive(mask: torch.Tensor, dtype, fill: float) -> torch.Tensor:
    """A boolean mask (True = attend) as a float mask to add to the scores: 0 or `fill`."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, fill)


def visible(mask):
    """The boolean view (True = attend) of a boolean or additive mask, for statistics."""
    return mask if mask is None or mask.dtype == torch.bool else mask == 0


def apply_mask(scores: torch.Tensor, mask, mask_fill: str) -> torch.Tensor:
    """The scores the softmax sees. A float mask is added. A boolean mask's hidden scores are
    replaced by the fill, or for add_minus_1e4 have it added (GPT-2's TF code: w * b - 1e4 * (1 - b)),
    so a future key whose score beats the visible ones by more than 1e4 still wins."""
    if mask is None:
        return scores
    if mask.dtype != torch.bool:
        return scores + mask
    if mask_fill.startswith("add_"):
        return scores + additive(mask, scores.dtype, fill_value(scores, mask_fill))
    return scores.masked_fill(~mask, fill_value(scores, mask_fill))


def fill_value(scores: torch.Tensor, mask_fill: str) -> float:
    """-inf leaves a row with no visible key as exp(-inf)/0 = NaN; the largest finite
    negative number turns such a row into a harmless uniform average. -1e4 (GPT-2) is finite
    but not out of reach: real scores can pass it."""
    if mask_fill in ("minus_1e4", "add_minus_1e4"):
        return MASKED_BIAS
    return float("-inf") if mask_fill == "neg_inf" else torch.finfo(scores.dtype).min
