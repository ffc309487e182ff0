"""config_roundtrip on a small model written here with a save and a load of its own (as
transformers' save_pretrained / from_pretrained): a configuration value the load overwrites with its
default (GPT-NeoX's rotary_pct in transformers 5.0) changes what the reloaded model computes."""
import json
import os
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_doctor import Layer, examine
from attention_doctor.hf import HFCausalLM
from attention_doctor.result import FAIL, INCONCLUSIVE, NA, PASS


class SavedLM(nn.Module):
    """A causal LM whose attention temperature is a config value; `lossy` loads reset it to 1."""
    lossy = False
    broken_save = False

    def __init__(self, config):
        super().__init__()
        self.config = config
        d = 16
        self.embed, self.qkv, self.head = nn.Embedding(32, d), nn.Linear(d, 3 * d), nn.Linear(d, 32)

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids, attention_mask=None, **kwargs):
        x = self.embed(input_ids)
        q, k, v = self.qkv(x).chunk(3, -1)
        T = x.shape[1]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        if attention_mask is not None:
            mask = mask & (attention_mask.bool()[:, None, :] | torch.eye(T, dtype=torch.bool))
        y = F.scaled_dot_product_attention(q * self.config.temperature, k, v, attn_mask=mask)
        return types.SimpleNamespace(logits=self.head(x + y))

    def save_pretrained(self, d):
        if self.broken_save:
            raise OSError("no space left on device")
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(vars(self.config), f)
        torch.save(self.state_dict(), os.path.join(d, "weights.pt"))

    @classmethod
    def from_pretrained(cls, d, **kwargs):
        with open(os.path.join(d, "config.json")) as f:
            raw = json.load(f)
        if cls.lossy:
            raw.pop("temperature")
        m = cls(types.SimpleNamespace(**{"temperature": 1.0, **raw}))
        m.load_state_dict(torch.load(os.path.join(d, "weights.pt")))
        return m


class LossyLM(SavedLM):
    lossy = True


class UnsavableLM(SavedLM):
    broken_save = True


class PaddingLostLM(LossyLM):
    """Loses its temperature on load, and the reloaded model raises on a padding mask."""

    def forward(self, input_ids, attention_mask=None, **kwargs):
        if attention_mask is not None and self.config.temperature == 1.0:
            raise ValueError("attention_mask needs the saved temperature")
        return super().forward(input_ids, attention_mask, **kwargs)


def doctor(cls, temperature=3.0):
    torch.manual_seed(0)
    m = cls(types.SimpleNamespace(vocab_size=32, temperature=temperature)).eval()
    return examine(HFCausalLM(m), checks=["config_roundtrip"], strict=True)["config_roundtrip"]


def test_a_model_that_reloads_what_it_saved_passes():
    r = doctor(SavedLM)
    assert r.outcome is PASS and r.measurements["plain"] == 0.0, r.detail


def test_a_config_value_lost_on_load_fails():
    r = doctor(LossyLM)
    assert r.outcome is FAIL and r.cause == "reload_differs" and r.measured > 1e-3, r.detail
    assert doctor(LossyLM, temperature=1.0).outcome is PASS   # lost, but the default is the value saved


def test_a_padded_batch_raising_only_once_reloaded_fails():
    torch.manual_seed(0)
    m = PaddingLostLM(types.SimpleNamespace(vocab_size=32, temperature=1.0 + 1e-9)).eval()
    r = examine(HFCausalLM(m), checks=["config_roundtrip"])["config_roundtrip"]
    assert r.outcome is FAIL and r.cause == "target_raised" and "ValueError" in r.reason + r.detail, r


def test_a_save_that_raises_is_inconclusive():
    r = doctor(UnsavableLM)
    assert r.outcome is INCONCLUSIVE and r.cause == "not_reloaded" and "OSError" in r.reason


def test_a_target_without_save_and_load_is_na():
    r = examine(Layer(nn.Linear(8, 8)), checks=["config_roundtrip"], strict=True)["config_roundtrip"]
    assert r.outcome is NA and r.cause == "no_save_load"
