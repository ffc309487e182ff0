"""Megatron-LM's manner (the legacy GPTModel, megatron/model/transformer.py): hidden states
sequence-first [s, b, h]; one `query_key_value` linear viewed as [s, b, np, 3 hn] and split per
head; the scores by `torch.baddbmm(buffer, q, k^T, beta=0.0, alpha=1 / norm_factor)` over
[b np, sq, sk]; its own scaled masked softmax (`mask_func` fills where the mask is True, then a
softmax); `torch.bmm` with v; the context permuted back to [s, b, h]; learned absolute positions;
the output layer tied to the word embeddings. A KV cache through `InferenceParams`
(`key_value_memory_dict`, `sequence_len_offset`), the mask sliced to the step's rows.

Interface: `forward(input_ids, position_ids=None, attention_mask=None, inference_params=None)`;
`attention_mask` is Megatron's: bool, True = masked out, (b, 1, s, s), the causal part included
(`get_ltor_masks_and_position_ids`); None gives the causal one. One departure: Megatron's
`attention_mask_func` fills with -10000.0, which leaks under large scores (the catalogue's
finite_mask_leak); the healthy one fills with the dtype's lowest, and -10000.0 is a planted bug."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from doctor_lab.styles._common import (
    HEAD_DIM,
    HEADS,
    LAYERS,
    MAX_POS,
    VOCAB,
    D,
    built,
    causal_keep,
    factories,
    fill,
    first_real,
    normalise,
    scale,
)

PLANTED = {
    "no_scaling": "baddbmm(..., alpha=1.0): norm_factor 1",
    "off_by_one": "get_ltor_mask: tril(diagonal=-1)",
    "sees_next": "get_ltor_mask: tril(diagonal=1)",
    "mask_ignored": "attention_mask taken and dropped: the causal mask made inside (a fused upper-triangular kernel's way)",
    "softmax_over_queries": "the softmax over dim -2",
    "naive_softmax": "exp / sum without the max subtracted",
    "sum_normalize": "scores / their sum, the masked ones set to 0",
    "no_transpose_merge": "context [b, np, sq, hn] viewed as [sq, b, hp] without permute(2, 0, 1, 3)",
    "neg_inf_fill": "mask_func fills with -inf: a left-padded row with no visible key is NaN",
    "finite_mask": "mask_func fills with -10000.0 (Megatron's attention_mask_func)",
    "cache_top_left": "attention_mask[..., :sq, :sequence_end] (rows from 0, not sequence_start)",
    "cache_positions_from_zero": "position_ids 0..s-1 under the cache (not from sequence_len_offset)",
}
CANNOT = {
    "cache_off_by_one": "the keys read ([:sequence_end]) and the mask's slice share sequence_end: a read one short "
                        "or long is a shape error on every cached call, not a silent cache bug",
}


class InferenceParams:
    def __init__(self, max_batch_size, max_sequence_length):
        self.max_sequence_length, self.max_batch_size = max_sequence_length, max_batch_size
        self.sequence_len_offset = self.batch_size_offset = 0
        self.key_value_memory_dict = {}


def get_ltor_mask(s, bug, device):
    """(1, 1, s, s) bool, True = masked (Megatron's convention)."""
    return ~causal_keep(s, s, bug, device)[None, None]


class CoreAttention(nn.Module):
    def __init__(self, bug):
        super().__init__()
        self.bug, self.hidden_size_per_partition = bug, D
        self.norm_factor = 1.0 / scale(HEAD_DIM, bug)
        self.attention_dropout = nn.Dropout(0.1)

    def scale_mask_softmax(self, scores, mask):
        fill_value = -10000.0 if self.bug == "finite_mask" else fill(self.bug, scores.dtype)
        return normalise(scores.masked_fill(mask, fill_value), self.bug, fill_zero=mask)

    def forward(self, query, key, value, attention_mask):
        sq, b, np_, hn = query.shape
        sk = key.shape[0]
        query, key = query.reshape(sq, b * np_, hn), key.reshape(sk, b * np_, hn)
        buffer = torch.empty(b * np_, sq, sk, dtype=query.dtype, device=query.device)
        scores = torch.baddbmm(buffer, query.transpose(0, 1), key.transpose(0, 1).transpose(1, 2),
                               beta=0.0, alpha=1.0 / self.norm_factor).view(b, np_, sq, sk)
        probs = self.attention_dropout(self.scale_mask_softmax(scores, attention_mask))
        context = torch.bmm(probs.view(b * np_, sq, sk), value.reshape(sk, b * np_, hn).transpose(0, 1)).view(b, np_, sq, hn)
        if self.bug != "no_transpose_merge":
            context = context.permute(2, 0, 1, 3).contiguous()
        return context.reshape(sq, b, self.hidden_size_per_partition)


class ParallelAttention(nn.Module):
    def __init__(self, bug, layer_number):
        super().__init__()
        self.bug, self.layer_number = bug, layer_number
        self.query_key_value = nn.Linear(D, 3 * D)
        self.core_attention = CoreAttention(bug)
        self.dense = nn.Linear(D, D)

    def forward(self, hidden_states, attention_mask, inference_params=None):
        sq, b, _ = hidden_states.shape
        mixed = self.query_key_value(hidden_states).view(sq, b, HEADS, 3 * HEAD_DIM)
        query, key, value = mixed.split(HEAD_DIM, dim=-1)
        if inference_params is not None:
            if self.layer_number not in inference_params.key_value_memory_dict:
                shape = (inference_params.max_sequence_length, inference_params.max_batch_size, HEADS, HEAD_DIM)
                inference_params.key_value_memory_dict[self.layer_number] = (
                    torch.zeros(shape, dtype=key.dtype, device=key.device), torch.zeros(shape, dtype=value.dtype, device=value.device))
            key_memory, value_memory = inference_params.key_value_memory_dict[self.layer_number]
            batch_start = inference_params.batch_size_offset
            batch_end = batch_start + b
            sequence_start = inference_params.sequence_len_offset
            sequence_end = sequence_start + sq
            key_memory[sequence_start:sequence_end, batch_start:batch_end] = key
            value_memory[sequence_start:sequence_end, batch_start:batch_end] = value
            key = key_memory[:sequence_end, batch_start:batch_end]
            value = value_memory[:sequence_end, batch_start:batch_end]
            rows = slice(0, sq) if self.bug == "cache_top_left" else slice(sequence_start, sequence_end)
            attention_mask = attention_mask[..., rows, :sequence_end]
        return self.dense(self.core_attention(query, key, value, attention_mask))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense_h_to_4h, self.dense_4h_to_h = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x):
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))


class ParallelTransformerLayer(nn.Module):
    def __init__(self, bug, layer_number):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = nn.LayerNorm(D), nn.LayerNorm(D)
        self.self_attention, self.mlp = ParallelAttention(bug, layer_number), MLP()

    def forward(self, hidden_states, attention_mask, inference_params=None):
        x = hidden_states + self.self_attention(self.input_layernorm(hidden_states), attention_mask, inference_params)
        return x + self.mlp(self.post_attention_layernorm(x))


class GPTModel(nn.Module):
    def __init__(self, bug=None):
        super().__init__()
        self.bug = bug
        self.word_embeddings, self.position_embeddings = nn.Embedding(VOCAB, D), nn.Embedding(MAX_POS, D)
        self.layers = nn.ModuleList(ParallelTransformerLayer(bug, i + 1) for i in range(LAYERS))
        self.final_layernorm = nn.LayerNorm(D)

    def forward(self, input_ids, position_ids=None, attention_mask=None, labels=None, inference_params=None):
        b, s = input_ids.shape
        offset = 0 if inference_params is None else inference_params.sequence_len_offset
        if position_ids is None:
            start = 0 if self.bug == "cache_positions_from_zero" else offset
            position_ids = torch.arange(start, start + s, device=input_ids.device)[None].expand(b, s)
        if attention_mask is None or self.bug == "mask_ignored":
            attention_mask = get_ltor_mask(offset + s, self.bug, input_ids.device)
        hidden = (self.word_embeddings(input_ids) + self.position_embeddings(position_ids)).transpose(0, 1)   # [s, b, h]
        for layer in self.layers:
            hidden = layer(hidden, attention_mask, inference_params)
        logits = F.linear(self.final_layernorm(hidden), self.word_embeddings.weight).transpose(0, 1)   # [b, s, v]
        if labels is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def build(bug=None, seed=0):
    return built(GPTModel, bug, PLANTED, seed)


def padded(model, ids, keep):
    """get_ltor_masks_and_position_ids' way, with the padded keys masked too and positions from the first real token."""
    T = ids.shape[1]
    masked = get_ltor_mask(T, None, ids.device) | ~keep[:, None, None, :]
    return model(ids, position_ids=first_real(keep, T, ids.device), attention_mask=masked)


def cached(model, ids, n_new):
    """text_generation's way: InferenceParams, the prompt, then the new tokens at sequence_len_offset."""
    B, T = ids.shape
    P = T - n_new
    params = InferenceParams(B, T)
    model(ids[:, :P], inference_params=params)
    params.sequence_len_offset += P
    return model(ids[:, P:], inference_params=params)


__getattr__ = factories(build, PLANTED)
