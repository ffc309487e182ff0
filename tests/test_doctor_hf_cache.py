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


def _tiny_llama(impl):
    from transformers import AutoModelForCausalLM, LlamaConfig
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2, pad_token_id=0)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).eval()


def test_the_static_half_decodes_through_a_static_cache():
    r = examine(HFCausalLM(_tiny_llama("sdpa")), checks=["kv_cache"], strict=True)["kv_cache"]
    assert r.outcome is PASS and r.measurements["static_cache"] <= 1e-5, r.detail
    assert "through a static cache against the grown one" in r.detail


def test_a_decode_step_that_drops_its_mask_fails_only_through_a_static_cache():
    """The pattern of transformers #30400: one new token attends to every key without a mask, right
    while the cache grows with the tokens (the dynamic trials pass), wrong in a preallocated cache whose
    empty slots are keys too."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def decode_unmasked(module, query, key, value, attention_mask, **kw):
        if query.shape[2] == 1:
            attention_mask = None   # "a single new token sees every key": true of a cache that holds only tokens
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)
    AttentionInterface.register("decode_unmasked", decode_unmasked)
    AttentionMaskInterface.register("decode_unmasked", sdpa_mask)   # the masks SDPA gets, which it drops
    r = examine(HFCausalLM(_tiny_llama("decode_unmasked")), checks=["kv_cache"], strict=True)["kv_cache"]
    assert r.outcome is FAIL and r.cause == "static_cache_differs", r.detail
    assert max(t["new"] for t in r.measurements["trials"]) <= 1e-5 < 1e-2 < r.measurements["static_cache"]


def test_a_forward_that_raises_only_through_a_static_cache_fails_there():
    """The pattern of transformers 5.0.0's XGLM and BERT decoders: a mask sized to the tokens seen, which
    a static cache's slots outnumber. The dynamic trials pass; the row says the static decoding raised."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def seen_tokens_only(module, query, key, value, attention_mask, **kw):
        if attention_mask is not None and bool((~attention_mask.bool()).any(-2).any()) and query.shape[2] == 1:
            raise ValueError("the keys outnumber the tokens seen")   # a static cache's empty slots
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)
    AttentionInterface.register("seen_tokens_only", seen_tokens_only)
    AttentionMaskInterface.register("seen_tokens_only", sdpa_mask)
    r = examine(HFCausalLM(_tiny_llama("seen_tokens_only")), checks=["kv_cache"], strict=True)["kv_cache"]
    assert r.outcome is FAIL and r.cause == "target_raised", r.detail
    assert r.measurements["raised_in"]["call"] == "static_generate", r.measurements
    assert "the keys outnumber the tokens seen" in r.measurements["error"]
    assert max(t["new"] for t in r.measurements["trials"]) <= 1e-5


class PromptSizedCache:
    """A preallocated cache as transformers 4.4x's HybridCache / StaticCache: its capacity fixed at
    construction (max_cache_len), slots written at cache_position, every slot a key (empty ones too)."""
    def __init__(self, config, max_batch_size, max_cache_len, device=None, dtype=None):
        self.max_cache_len = max_cache_len
        self.k = [torch.zeros(max_batch_size, 2, max_cache_len, 8) for _ in range(2)]
        self.v = [torch.zeros(max_batch_size, 2, max_cache_len, 8) for _ in range(2)]

    def update(self, k, v, i, cache_position):
        self.k[i][:, :, cache_position] = k   # IndexError past its capacity, as HybridCache's
        self.v[i][:, :, cache_position] = v
        return self.k[i], self.v[i]


class PromptSizedCacheLM(GivenCacheLM):
    """Gemma2 in transformers 4.4x: use_cache=True with no cache makes one sized to the prompt (a step
    past it raises); generate() gives one with room and passes cache_position, which the mask needs."""
    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=False, cache_position=None,
                **kwargs):
        B, T = input_ids.shape
        if use_cache and past_key_values is None:
            past_key_values = PromptSizedCache(self.config, B, T)
        pos = torch.arange(T) if cache_position is None else cache_position
        x = self.embed(input_ids) + self.pos(pos)
        for i, qkv in enumerate(self.qkv):
            q, k, v = (t.view(B, T, self.h, -1).transpose(1, 2) for t in qkv(x).chunk(3, -1))
            if past_key_values is not None:
                k, v = past_key_values.update(k, v, i, pos)
            visible = torch.arange(k.shape[-2]) <= pos[:, None]   # the slots written so far, causally
            x = x + F.scaled_dot_product_attention(q, k, v, attn_mask=visible).transpose(1, 2).reshape(B, T, -1)
        return types.SimpleNamespace(logits=self.head(x), past_key_values=past_key_values if use_cache else None)


def test_a_cache_sized_to_the_prompt_is_given_room_as_generate_gives_it():
    torch.manual_seed(0)
    r = examine(HFCausalLM(PromptSizedCacheLM().eval()), checks=["kv_cache"], strict=True)["kv_cache"]
    assert r.outcome is PASS and r.measured <= 1e-5, r.detail
    assert [t["new_tokens"] for t in r.measurements["trials"]] == [1, 3]


class InPlaceCacheLM(GivenCacheLM):
    """XLM in transformers 5.x: the forward returns no cache; a cache passed under `cache` is filled in
    place, and a later call is fed the whole sequence, of which it runs only what its cache lacks.
    `forgets`: a step that drops the cached keys (each call attends to its own tokens only)."""
    def __init__(self, forgets=False):
        super().__init__()
        self.forgets = forgets

    def forward(self, input_ids, attention_mask=None, cache=None, use_cache=None, **kwargs):
        past = 0 if cache is None else cache.get_seq_length()
        input_ids = input_ids[:, past:]   # what the cache lacks (fed the new tokens alone: nothing)
        B, T = input_ids.shape
        x = self.embed(input_ids) + self.pos(torch.arange(past, past + T))
        for i, qkv in enumerate(self.qkv):
            q, k, v = (t.view(B, T, self.h, -1).transpose(1, 2) for t in qkv(x).chunk(3, -1))
            if cache is not None:
                kk, vv = cache.update(k, v, i)
                k, v = (k, v) if self.forgets else (kk, vv)
            visible = torch.ones(T, k.shape[-2], dtype=torch.bool).tril(k.shape[-2] - T)
            x = x + F.scaled_dot_product_attention(q, k, v, attn_mask=visible).transpose(1, 2).reshape(B, T, -1)
        return types.SimpleNamespace(logits=self.head(x))


def test_a_cache_filled_in_place_is_driven_the_way_the_forward_reads_it():
    torch.manual_seed(0)
    r = examine(HFCausalLM(InPlaceCacheLM().eval()), checks=["kv_cache"], strict=True)["kv_cache"]
    assert r.outcome is PASS and r.measured <= 1e-5, r.detail
    assert [t["new_tokens"] for t in r.measurements["trials"]] == [1, 3]


def test_a_cache_filled_in_place_that_a_step_does_not_read_fails():
    torch.manual_seed(0)
    r = examine(HFCausalLM(InPlaceCacheLM(forgets=True).eval()), checks=["kv_cache"], strict=True)["kv_cache"]
    assert r.outcome is FAIL and r.cause == "new_tokens_differ", r.detail
