"""`torch.nn.TransformerDecoderLayer` used decoder-only, as tutorials and small from-scratch models
do: an `nn.TransformerDecoder` whose memory is the sequence itself, both attentions under the
causal `tgt_mask` from `nn.Transformer.generate_square_subsequent_mask` (float, -inf above the
diagonal) and the padding as `tgt_key_padding_mask` / `memory_key_padding_mask` (True = ignore);
learned absolute positions counted from each row's first real token.

Interface: `forward(input_ids, attention_mask=None)`; `attention_mask` (B, T), 1 = a real token. No
cache (nn.TransformerDecoder keeps none)."""
import torch
import torch.nn as nn

from doctor_lab.styles._common import HEADS, LAYERS, MAX_POS, VOCAB, D, built, factories, first_real

PLANTED = {
    "off_by_one": "the square mask triu(diagonal=0): the diagonal -inf too",
    "sees_next": "the square mask triu(diagonal=2)",
    "mask_ignored": "attention_mask taken, no key_padding_mask passed",
}
INSIDE = "inside nn.MultiheadAttention (it scales, normalises and merges the heads itself)"
CANNOT = {
    "no_scaling": INSIDE, "softmax_over_queries": INSIDE, "naive_softmax": INSIDE, "sum_normalize": INSIDE,
    "no_transpose_merge": INSIDE,
    "neg_inf_fill": "the causal mask is already -inf and nn.MultiheadAttention (SDPA, need_weights=False) gives 0 "
                    "for a row with no visible key: no NaN row to spread",
    "cache_top_left": "no KV cache in nn.TransformerDecoder", "cache_off_by_one": "no KV cache in nn.TransformerDecoder",
    "cache_positions_from_zero": "no KV cache in nn.TransformerDecoder",
}
# the mask still sets the positions (first_real): honoured there, ignored by the attention, so no
# encoding is inert and the doctor names the side that moves
EXPECTS = {"mask_ignored": (("padding", "left_padding"),)}


def square_subsequent_mask(T, bug, device):
    """nn.Transformer.generate_square_subsequent_mask, with the diagonal the bug moves."""
    diagonal = {"off_by_one": 0, "sees_next": 2}.get(bug, 1)
    return torch.triu(torch.full((T, T), float("-inf"), device=device), diagonal=diagonal)


class DecoderOnlyLM(nn.Module):
    def __init__(self, bug=None):
        super().__init__()
        self.bug = bug
        self.tok, self.pos = nn.Embedding(VOCAB, D), nn.Embedding(MAX_POS, D)
        layer = nn.TransformerDecoderLayer(D, HEADS, dim_feedforward=2 * D, dropout=0.1, batch_first=True, norm_first=True)
        self.decoder = nn.TransformerDecoder(layer, LAYERS, norm=nn.LayerNorm(D))
        self.head = nn.Linear(D, VOCAB)

    def forward(self, input_ids, attention_mask=None):
        T = input_ids.shape[1]
        keep = None if attention_mask is None else attention_mask.bool()
        h = self.tok(input_ids) + self.pos(first_real(keep, T, input_ids.device))
        causal = square_subsequent_mask(T, self.bug, input_ids.device).to(h.dtype)
        ignore = None if keep is None or self.bug == "mask_ignored" else ~keep
        out = self.decoder(h, h, tgt_mask=causal, memory_mask=causal,
                           tgt_key_padding_mask=ignore, memory_key_padding_mask=ignore)
        return self.head(out)


def build(bug=None, seed=0):
    return built(DecoderOnlyLM, bug, PLANTED, seed)


def padded(model, ids, keep):
    return model(ids, attention_mask=keep.long())


__getattr__ = factories(build, PLANTED)
