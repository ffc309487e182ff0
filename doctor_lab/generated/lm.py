"""The generated LM: tokens (+ learned positions), blocks of pre-norm attention + MLP, a final norm
and the head; its forward in the style's cache convention. `build(style, bug, seed)` makes it
seeded and in eval mode (a healthy twin has the same weights: parameters made in one order)."""
import torch
import torch.nn as nn

from doctor_lab.generated import positions as P
from doctor_lab.generated.attention import Attention, keep_mask

VOCAB = 64
SIZES = {"d32_l2": (32, 2), "d64_l1": (64, 1)}


class Block(nn.Module):
    def __init__(self, style, bug, d):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(d), Attention(style, bug, d), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, h, pos, q_start, mask, past=None):
        a, kv = self.attn(self.ln1(h), pos, q_start, mask, past)
        h = h + a
        return h + self.mlp(self.ln2(h)), kv


class LM(nn.Module):
    def __init__(self, style, bug):
        super().__init__()
        self.style, self.bug = style, bug
        d, layers = SIZES[style["size"]]
        self.tok = nn.Embedding(VOCAB, d)
        self.wpe = nn.Embedding(P.MAX_POS, d) if style["positions"] == "learned" else None
        self.blocks = nn.ModuleList(Block(style, bug, d) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, VOCAB, bias=False)

    def trunk(self, ids, attention_mask, position_ids, pasts):
        """Logits of ids (B, T) after pasts (per layer (k, v) or None); returns (logits, new pasts)."""
        B, T = ids.shape
        t_past = 0 if pasts is None else pasts[0][0].shape[2]
        pad = None if attention_mask is None or self.bug == "mask_ignored" else attention_mask.bool()
        if pad is not None and pad.shape[1] < t_past + T:   # a mask over the new tokens only: the cache is real
            pad = torch.cat([pad.new_ones(B, t_past + T - pad.shape[1]), pad], 1)
        q_start = 0 if self.bug == "cache_positions_from_zero" else t_past
        if position_ids is not None:
            pos = position_ids
        elif self.style["positions"] == "learned" and pad is not None and self.bug != "left_pad_positions":
            pos = P.first_real(pad, t_past + T)[:, -T:] + (q_start - t_past)
        else:
            pos = (torch.arange(T) + q_start)[None]
        pos = pos.to(ids.device)
        h = self.tok(ids) + (self.wpe(pos) if self.wpe is not None else 0)
        mask = pad
        if self.style["mask_at"] == "model":
            mask = keep_mask(pad, T, t_past + T, t_past, self.style, self.bug, ids.device)
        new = []
        for i, block in enumerate(self.blocks):
            h, kv = block(h, pos, q_start, mask, None if pasts is None else pasts[i])
            new.append(kv)
        return self.head(self.ln_f(h)), new


class NoCacheLM(LM):
    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return self.trunk(input_ids, attention_mask, position_ids, None)[0]


class StartPosLM(LM):
    """Meta's convention: a cache kept inside, written at start_pos; read up to start_pos + T (slots
    never written are zeros, as a preallocated cache's). No position ids: start_pos is the positions."""
    def forward(self, tokens, start_pos=0, attention_mask=None):
        B, T = tokens.shape
        kept = getattr(self, "_kv", None)
        if start_pos == 0 or kept is None or kept[0][0].shape[0] != B:
            kept = None
        pasts = None
        if start_pos > 0:
            pasts = [tuple(grown(t, start_pos) for t in kv) for kv in kept] if kept is not None else None
            if pasts is None:
                shapes = [b.attn.kv_heads for b in self.blocks]
                d = self.blocks[0].attn.wo.in_features // self.blocks[0].attn.heads
                pasts = [tuple(torch.zeros(B, h, start_pos, d, device=tokens.device) for _ in "kv") for h in shapes]
        logits, new = self.trunk(tokens, attention_mask, None, pasts)
        self._kv = [tuple(t.detach() for t in kv) for kv in new]
        return logits


def grown(t, length):
    """The first `length` slots of a cache, zeros past what it holds."""
    if t.shape[2] >= length:
        return t[:, :, :length]
    return torch.cat([t, t.new_zeros(*t.shape[:2], length - t.shape[2], t.shape[3])], 2)


class IntermediatesLM(LM):
    """x-transformers' convention: the whole sequence in; with a cache (the intermediates a previous
    call returned) only its last cache_age tokens computed."""
    def forward(self, x, attention_mask=None, position_ids=None, cache=None, return_intermediates=False,
                cache_age=1):
        if cache is not None:
            x = x[:, -cache_age:]
            position_ids = None if position_ids is None else position_ids[:, -cache_age:]
        logits, new = self.trunk(x, attention_mask, position_ids, cache)
        return (logits, new) if return_intermediates else logits


class PresentsLM(LM):
    """transformers' older convention by hand: past_key_values in, (logits, presents) out with use_cache."""
    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False):
        logits, new = self.trunk(input_ids, attention_mask, position_ids, past_key_values)
        return (logits, tuple(new)) if use_cache else logits


CONVENTIONS = {"none": NoCacheLM, "start_pos": StartPosLM, "intermediates": IntermediatesLM, "presents": PresentsLM}


def build(style, bug=None, seed=0) -> nn.Module:
    """The style's LM with bug planted (None or "healthy": none), seeded, in eval mode."""
    torch.manual_seed(seed)
    return CONVENTIONS[style["cache"]](style, None if bug == "healthy" else bug).eval()
