"""kv_cache through the transformers adapter on a small model written here that behaves as Nemotron
in transformers 4.x: use_cache=True makes no cache of its own; given one (generate() gives a
DynamicCache), it uses it. The adapter gives the prefill an empty DynamicCache, as generate() does,
so the cache is examined, not left `inconclusive` as one the doctor does not drive."""
import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_doctor import examine
from attention_doctor.hf import HFCausalLM
from attention_doctor.result import FAIL, PASS

transformers = pytest.importorskip("transformers", reason="needs transformers (requirements-validation.txt)")
pytestmark = pytest.mark.validation


class GivenCacheLM(nn.Module):
    def __init__(self, positions_from_zero=False):
        super().__init__()
        self.config = types.SimpleNamespace(vocab_size=32, _attn_implementation="sdpa")
        self.positions_from_zero = positions_from_zero   # Nemotron 4.46.3: a step without cache_position starts at 0
        d, self.h = 16, 2
        self.embed, self.pos = nn.Embedding(32, d), nn.Embedding(64, d)
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(2))
        self.head = nn.Linear(d, 32)

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=False, **kwargs):
        B, T = input_ids.shape
        past = 0 if past_key_values is None or self.positions_from_zero else past_key_values.get_seq_length()
        x = self.embed(input_ids) + self.pos(torch.arange(past, past + T))
        for i, qkv in enumerate(self.qkv):
            q, k, v = (t.view(B, T, self.h, -1).transpose(1, 2) for t in qkv(x).chunk(3, -1))
            if past_key_values is not None:
                k, v = past_key_values.update(k, v, i)
            visible = torch.ones(T, k.shape[-2], dtype=torch.bool).tril(k.shape[-2] - T)
            x = x + F.scaled_dot_product_attention(q, k, v, attn_mask=visible).transpose(1, 2).reshape(B, T, -1)
        return types.SimpleNamespace(logits=self.head(x), past_key_values=past_key_values if use_cache else None)


def test_a_cache_given_to_the_prefill_is_examined():
    torch.manual_seed(0)
    r = examine(HFCausalLM(GivenCacheLM().eval()), checks=["kv_cache"], strict=True)["kv_cache"]
    assert r.outcome is PASS, r.detail


def test_a_step_placed_at_position_zero_fails():
    torch.manual_seed(0)
    r = examine(HFCausalLM(GivenCacheLM(positions_from_zero=True).eval()), checks=["kv_cache"], strict=True)["kv_cache"]
    assert r.outcome is FAIL and r.cause == "new_tokens_differ", r.detail
