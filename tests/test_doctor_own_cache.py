"""kv_cache on a cache of a model's own kind, which only its generate() drives: a small recurrent LM
written here with the pattern of RWKV in transformers (a `state` argument and output, a token shift
taken from the state on one-token steps). Healthy, the tokens generate() decodes with the state match
those decoded without it; with the state's token shift missing its time axis (transformers' RWKV up to
5.25.0) a batch broadcasts against itself and the decoding differs. A generate() that decodes with its
cache either way leaves nothing to compare: inconclusive, never a pass."""
from dataclasses import dataclass

import pytest
import torch
import torch.nn as nn

from attention_doctor import examine
from attention_doctor.hf import HFCausalLM
from attention_doctor.result import FAIL, INCONCLUSIVE, PASS

transformers = pytest.importorskip("transformers", reason="needs transformers (requirements-validation.txt)")
pytestmark = pytest.mark.validation

from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel  # noqa: E402
from transformers.utils import ModelOutput  # noqa: E402


class ShiftConfig(PretrainedConfig):
    model_type = "doctor_token_shift"

    def __init__(self, vocab_size=32, hidden_size=16, num_hidden_layers=1, **kw):
        super().__init__(**kw)
        self.vocab_size, self.hidden_size, self.num_hidden_layers = vocab_size, hidden_size, num_hidden_layers


@dataclass
class ShiftOutput(ModelOutput):
    logits: torch.Tensor | None = None
    state: list | None = None


class ShiftLM(PreTrainedModel, GenerationMixin):
    """Each token's output mixes its embedding with the previous token's and a running sum (a
    recurrence); `state` holds (the last token's embedding, the sum)."""
    config_class = ShiftConfig

    def __init__(self, config, shift_without_time_axis=False, always_cached=False):
        super().__init__(config)
        d = config.hidden_size
        self.embed, self.mix, self.head = nn.Embedding(config.vocab_size, d), nn.Linear(2 * d, d), nn.Linear(d, config.vocab_size)
        self.shift_without_time_axis, self.always_cached = shift_without_time_axis, always_cached
        self.post_init()

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids, attention_mask=None, state=None, use_cache=None, **kwargs):
        h = self.embed(input_ids)                                               # (B, T, d)
        if state is not None and h.shape[1] == 1:
            last = state[0] if self.shift_without_time_axis else state[0][:, None]   # RWKV: (B, d), no time axis
        else:
            last = torch.cat([torch.zeros_like(h[:, :1]) if state is None else state[0][:, None], h[:, :-1]], 1)
        mixed = h + last                                                        # (B, B, d) without the axis
        total = mixed.cumsum(1) + (0 if state is None else state[1][:, None])
        out = self.head(torch.tanh(self.mix(torch.cat([mixed, total], -1))))
        return ShiftOutput(logits=out, state=[h[:, -1], total[:, -1]] if use_cache or self.always_cached else None)

    def prepare_inputs_for_generation(self, input_ids, state=None, use_cache=None, **kwargs):
        if state is not None:
            input_ids = input_ids[:, -1:]
        return {"input_ids": input_ids, "state": state, "use_cache": True if self.always_cached else use_cache}


def kv(**kw):
    torch.manual_seed(0)
    model = ShiftLM(ShiftConfig(), **kw).eval()
    return examine(HFCausalLM(model), checks=["kv_cache"], strict=True)["kv_cache"]


def test_a_cache_of_its_own_kind_is_decoded_through_generate():
    r = kv()
    assert r.outcome is PASS and r.measurements["generated"] <= 1e-5, r.detail
    assert "driven by its generate()" in r.detail


def test_a_token_shift_without_its_time_axis_fails():
    r = kv(shift_without_time_axis=True)
    assert r.outcome is FAIL and r.cause == "new_tokens_differ" and r.measurements["generated"] > 1e-2, r.detail


def test_a_generate_that_always_caches_is_inconclusive():
    r = kv(always_cached=True)
    assert r.outcome is INCONCLUSIVE and "nothing uncached to compare with" in r.reason, r.reason
