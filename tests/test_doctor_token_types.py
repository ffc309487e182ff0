"""future_leak with token types, on a small model written here with the pattern of Gemma3 in
transformers 4.53 (#38053 again): token_type_ids mark image tokens, each run attended bidirectionally
within itself. Grouped by runs, a run sees itself and no later run; grouped by distance (two type-1
tokens at most `span` apart are "the same image"), a run sees the start of the next one."""
import types

import pytest
import torch
import torch.nn.functional as F

from attention_doctor import examine
from attention_doctor.hf import HFCausalLM
from attention_doctor.result import FAIL, PASS
from tests.test_doctor_hf_cache import GivenCacheLM

pytestmark = pytest.mark.validation


class TypedLM(GivenCacheLM):
    def __init__(self, span=None, image_token=True):
        super().__init__()
        # the config says what a type means: an image token (Gemma3's image_token_index); without one, the
        # types might be a prefix LM's one block (HRM), which two runs would rightly join
        self.config = types.SimpleNamespace(vocab_size=32, **({"image_token_index": 31} if image_token else {}))
        self.span = span   # None: runs of type 1 grouped by run (healthy); an int: by distance (the 4.53 mask)

    def visible(self, T, token_type_ids):
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        if token_type_ids is None:
            return causal
        img = token_type_ids == 1                                           # (B, T)
        both = img[:, :, None] & img[:, None, :]
        if self.span is None:
            run = torch.cumsum(img & ~F.pad(img, (1, 0))[:, :-1], 1)         # the run each type-1 token is in
            same = run[:, :, None] == run[:, None, :]
        else:
            i = torch.arange(T)
            same = (i[:, None] - i[None, :]).abs() <= self.span
        return (causal | (both & same))[:, None]

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, use_cache=False, **kwargs):
        B, T = input_ids.shape
        x = self.embed(input_ids) + self.pos(torch.arange(T))
        vis = self.visible(T, token_type_ids)
        for qkv in self.qkv:
            q, k, v = (t.view(B, T, self.h, -1).transpose(1, 2) for t in qkv(x).chunk(3, -1))
            x = x + F.scaled_dot_product_attention(q, k, v, attn_mask=vis).transpose(1, 2).reshape(B, T, -1)
        return types.SimpleNamespace(logits=self.head(x), past_key_values=None)


def leak(model):
    torch.manual_seed(0)
    return examine(HFCausalLM(model.eval()), checks=["future_leak"], strict=True)["future_leak"]


def test_runs_grouped_by_run_pass_and_the_types_are_read():
    r = leak(TypedLM())
    assert r.outcome is PASS and r.measurements["later_block"] == 0.0, r.detail


def test_runs_grouped_by_distance_see_the_next_run():
    r = leak(TypedLM(span=8))
    assert r.outcome is FAIL and r.cause == "later_block_seen", r.detail
    assert r.measurements["later_block"] > 1e-3 and max(o["change"] for o in r.measurements["outputs"]) == 0.0


def test_types_whose_meaning_the_config_does_not_declare_are_not_judged():
    r = leak(TypedLM(span=8, image_token=False))
    assert r.outcome is PASS and r.measurements["later_block"] is None and "token types: n/a" in r.detail
