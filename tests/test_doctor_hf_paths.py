"""path_agreement through the transformers adapter on a small model written here that behaves as
older transformers releases do: its attention implementation is fixed when it is built (no
set_attn_implementation: the adapter rebuilds it with the same weights), and asking its SDPA layers
for the weights runs their eager forward (the output_attentions path)."""
import copy
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_doctor import examine
from attention_doctor.hf import OUTPUT_ATTENTIONS, HFCausalLM
from attention_doctor.result import FAIL, PASS


class Attention(nn.Module):
    def __init__(self, d, heads, impl, weights_drop_mask):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.h, self.impl, self.weights_drop_mask = heads, impl, weights_drop_mask

    def forward(self, x, causal, output_attentions=False):
        B, T, d = x.shape
        q, k, v = (p(x).view(B, T, self.h, d // self.h).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        if self.impl == "sdpa" and not output_attentions:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        else:   # eager; an SDPA layer asked for its weights runs this too
            s = q @ k.transpose(-2, -1) / (d // self.h) ** 0.5
            if not (output_attentions and self.impl == "sdpa" and self.weights_drop_mask):
                s = s.masked_fill(~causal, float("-inf"))
            y = s.softmax(-1) @ v
        return y.transpose(1, 2).reshape(B, T, d)


class BuiltLM(nn.Module):
    """A causal LM whose attention implementation is chosen at build (config._attn_implementation)."""
    def __init__(self, config):
        super().__init__()
        self.config = config
        d = 16
        self.embed = nn.Embedding(config.vocab_size, d)
        self.layers = nn.ModuleList(Attention(d, 2, config._attn_implementation, config.weights_drop_mask)
                                    for _ in range(2))
        self.head = nn.Linear(d, config.vocab_size)

    @classmethod
    def _from_config(cls, config, attn_implementation=None):
        config = copy.deepcopy(config)
        config._attn_implementation = attn_implementation or config._attn_implementation
        return cls(config)

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids, attention_mask=None, position_ids=None, output_attentions=False, **kwargs):
        x = self.embed(input_ids)
        T = x.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        if attention_mask is not None:
            causal = causal & (attention_mask.bool()[:, None, None, :] | torch.eye(T, dtype=torch.bool))   # no empty row
        for layer in self.layers:
            x = x + layer(x, causal, output_attentions)
        return types.SimpleNamespace(logits=self.head(x))


def model(impl="sdpa", weights_drop_mask=False):
    torch.manual_seed(0)
    cfg = types.SimpleNamespace(vocab_size=32, _attn_implementation=impl, weights_drop_mask=weights_drop_mask)
    return BuiltLM(cfg).eval()


def test_paths_of_a_model_built_with_its_implementation():
    a = HFCausalLM(model())
    assert a.paths() == ["eager", "sdpa", OUTPUT_ATTENTIONS]
    with a.use_path("eager"):
        assert a.implementation == "eager" and a.module is not None
    assert a.implementation == "sdpa"
    assert HFCausalLM(model("eager")).paths() == ["eager", "sdpa"]   # eager asked for weights is eager


class RefusesWeights(BuiltLM):
    def forward(self, input_ids, output_attentions=False, **kwargs):
        if output_attentions:
            raise ValueError("this model cannot return attention weights")
        return super().forward(input_ids, **kwargs)


def test_a_model_that_refuses_the_weights_has_no_such_path():
    torch.manual_seed(0)
    m = RefusesWeights(types.SimpleNamespace(vocab_size=32, _attn_implementation="sdpa", weights_drop_mask=False)).eval()
    r = examine(HFCausalLM(m), checks=["path_agreement"], strict=True)["path_agreement"]
    assert r.outcome is PASS and [x["path"] for x in r.measurements["against_first"]] == ["sdpa"], r.detail


def test_the_paths_agree_on_a_healthy_model():
    r = examine(HFCausalLM(model()), checks=["path_agreement"], strict=True)["path_agreement"]
    assert r.outcome is PASS, r.detail
    assert [x["path"] for x in r.measurements["against_first"]] == ["sdpa", OUTPUT_ATTENTIONS]


def test_weights_asked_for_without_the_causal_mask_fail():
    r = examine(HFCausalLM(model(weights_drop_mask=True)), checks=["path_agreement"], strict=True)["path_agreement"]
    assert r.outcome is FAIL and r.cause == "paths_differ", r.detail
    by = {x["path"]: x["plain"] for x in r.measurements["against_first"]}
    assert by["sdpa"] < 1e-5 < by[OUTPUT_ATTENTIONS]


class NoSdpa(BuiltLM):
    """As transformers 4.4x builds a model whose class has no SDPA: _from_config asks of the
    implementation only where the config is not marked as checked (_attn_implementation_autoset, set on
    every built model's config); unchecked it builds, config saying sdpa, on layers that do not run it."""
    @classmethod
    def _from_config(cls, config, attn_implementation=None):
        config = copy.deepcopy(config)
        config._attn_implementation = attn_implementation or config._attn_implementation
        if not getattr(config, "_attn_implementation_autoset", False):
            if config._attn_implementation == "sdpa":
                raise ValueError(f"{cls.__name__} does not support an attention implementation through "
                                 "torch.nn.functional.scaled_dot_product_attention yet")
            config._attn_implementation_autoset = True
        return cls(config)

    def __init__(self, config):
        super().__init__(types.SimpleNamespace(**{**vars(config), "_attn_implementation": "eager"}))
        self.config = config


def test_a_release_that_refuses_sdpa_for_the_model_has_no_such_path():
    torch.manual_seed(0)
    cfg = types.SimpleNamespace(vocab_size=32, _attn_implementation="eager", weights_drop_mask=False)
    m = NoSdpa._from_config(cfg).eval()
    assert m.config._attn_implementation_autoset
    assert HFCausalLM(m).paths() == []   # the release's own gate asked, as on a user's from_config
    r = examine(HFCausalLM(m), checks=["path_agreement"], strict=True)["path_agreement"]
    assert r.outcome.value == "n/a" and r.cause == "no_paths", r.detail
