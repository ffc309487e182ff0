"""sliding_window on a small windowed LM written here (not a transformers model): each layer masks
keys more than `window` back, or does not (the window dropped from the mask), and declares what it
does through the adapter; and the declaration read from a transformers-style config."""
import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_doctor import Adapter, examine
from attention_doctor.hf import declared_windows
from attention_doctor.result import FAIL, INCONCLUSIVE, NA, PASS
from attention_doctor.signals import Unsupported

SCAN = "scan"


class Attention(nn.Module):
    """Causal SDPA self-attention whose mask hides keys `window` or more back (None: causal only)."""
    def __init__(self, d, heads, window):
        super().__init__()
        self.qkv, self.h, self.window = nn.Linear(d, 3 * d), heads, window

    def _qkv_mask(self, x):
        """q, k, v (B, h, T, d_head) and the causal mask of the window (T, T: True = visible)."""
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        i = torch.arange(T)
        mask = i[:, None] >= i[None, :]
        if self.window is not None:
            mask = mask & (i[:, None] - i[None, :] < self.window)
        return q, k, v, mask

    def forward(self, x):
        q, k, v, mask = self._qkv_mask(x)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(x.shape)


class SinkAttention(Attention):
    """The same attention written by hand with a learned sink logit per head concatenated after the
    keys' scores before the softmax, and dropped after it (GPT-OSS's and MiMo's eager pattern)."""
    def __init__(self, d, heads, window):
        super().__init__(d, heads, window)
        self.sinks = nn.Parameter(torch.zeros(heads))

    def forward(self, x):
        B, T, d = x.shape
        q, k, v, mask = self._qkv_mask(x)
        s = (q @ k.transpose(-2, -1)) / (d // self.h) ** 0.5
        s = s.masked_fill(~mask, torch.finfo(s.dtype).min)
        s = torch.cat([s, self.sinks.view(1, -1, 1, 1).expand(B, -1, T, 1)], dim=-1)
        w = torch.softmax(s, dim=-1)[..., :-1]
        return (w @ v).transpose(1, 2).reshape(B, T, d)


class PostWindowAttention(Attention):
    """The window applied after the softmax: causal weights multiplied by the window's band and
    renormalised (the mask the scores show is causal only; what mixes the values is windowed)."""
    def forward(self, x):
        B, T, d = x.shape
        q, k, v, mask = self._qkv_mask(x)
        i = torch.arange(T)
        s = ((q @ k.transpose(-2, -1)) / (d // self.h) ** 0.5).masked_fill(i[:, None] < i[None, :], float("-inf"))
        w = torch.softmax(s, dim=-1) * mask
        return ((w / w.sum(-1, keepdim=True)) @ v).transpose(1, 2).reshape(B, T, d)


class Scan(nn.Module):
    """A recurrent layer of no softmax attention (a running mean): carries every token past any window."""
    def forward(self, x):
        return x.cumsum(1) / torch.arange(1, x.shape[1] + 1)[:, None]


class WindowLM(nn.Module):
    """Token embedding, one attention layer per entry of `applied` (its window; SCAN: a Scan), a head."""
    def __init__(self, applied, vocab=16, d=16, heads=2):
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab, d), nn.Linear(d, vocab)
        self.layers = nn.ModuleList(Scan() if w == SCAN else {"sink": SinkAttention, "post": PostWindowAttention}[w[0]](
            d, heads, w[1]) if isinstance(w, tuple) else Attention(d, heads, w) for w in applied)

    def forward(self, ids):
        x = self.emb(ids)
        for layer in [self.layers[i] for i in self.order] if getattr(self, "order", None) else self.layers:
            x = x + layer(x)
        return self.head(x)


class Declared(Adapter):
    """The LM with the window it declares: (size, sliding per layer), or None for no declaration."""
    vocab_size = 16

    def __init__(self, module, declared, named=True):
        super().__init__(module, "window lm")
        self.declared, self.named = declared, named

    def forward(self, x, mask=None, positions=None):
        return self.module(x)

    def windows(self):
        if self.declared is None:
            return super().windows()
        return self.declared

    def window_layers(self):
        return [f"layers.{i}" for i in range(len(self.module.layers))] if self.named else None


def run(applied, declared):
    torch.manual_seed(0)
    return examine(Declared(WindowLM(applied), declared), checks=["sliding_window"], strict=True)["sliding_window"]


def test_window_applied_as_declared_passes():
    r = run([4, 4], (4, [True, True]))
    assert r.outcome is PASS, r.detail
    assert r.measurements["change"] == 0.0


def test_window_dropped_from_the_mask_fails():
    r = run([None, None], (4, [True, True]))
    assert r.outcome is FAIL and r.cause == "window_ignored", r.detail
    assert r.measured > 1e-3


def test_window_applied_where_declared_off_fails():
    r = run([4, 4], (4, [False, False]))
    assert r.outcome is FAIL and r.cause == "window_applied", r.detail
    assert run([None, None], (4, [False, False])).outcome is PASS


def test_mixed_layers_read_per_call():
    r = run([4, None], (4, [True, False]))
    assert r.outcome is PASS, r.detail
    assert [x["far_keys_visible"] > 0 for x in r.measurements["layers"]] == [False, True]
    r = run([None, None], (4, [True, False]))   # the sliding layer lost its window
    assert r.outcome is FAIL and r.cause == "window_ignored", r.detail
    r = run([4, 4], (4, [True, False]))         # the full layer got one
    assert r.outcome is FAIL and r.cause == "window_applied", r.detail


def test_sinks_concatenated_to_the_scores_leave_the_mask_readable():
    # each call's mask over the tokens' keys is the block before the sink column (GPT-OSS, MiMo)
    r = run([("sink", 4), ("sink", None)], (4, [True, False]))
    assert r.outcome is PASS, r.detail
    assert [x["far_keys_visible"] > 0 for x in r.measurements["layers"]] == [False, True]
    r = run([("sink", None), 4], (4, [True, False]))   # the sliding sink layer lost its window, the full one got one
    assert r.outcome is FAIL and r.cause == "window_ignored", r.detail
    assert [x["far_keys_visible"] > 0 for x in r.measurements["layers"]] == [True, False]


def looped(applied, declared, order, named=True):
    """A recurrent-depth model's pattern (transformers' Dory): layers run in `order`, one of them more
    than once; the adapter names each declared layer's module (or not)."""
    torch.manual_seed(0)
    lm = WindowLM(applied)
    lm.order = order
    return examine(Declared(lm, declared, named), checks=["sliding_window"], strict=True)["sliding_window"]


def test_a_window_applied_after_the_softmax_is_read_from_the_weights_that_mix_the_values():
    r = run([("post", 4), ("post", None)], (4, [True, False]))
    assert r.outcome is PASS, r.detail   # the scores' mask is causal only: read alone, a false window_ignored
    assert [x["far_keys_visible"] > 0 for x in r.measurements["layers"]] == [False, True]
    r = run([("post", 4), ("post", None)], (4, [True, True]))
    assert r.outcome is FAIL and r.cause == "window_ignored", r.detail


def test_a_layer_run_twice_is_matched_to_its_module():
    r = looped([4, None, 4], (4, [True, False, True]), [0, 1, 1, 2])
    assert r.outcome is PASS, r.detail
    assert [(x["layer"], x["far_keys_visible"] > 0) for x in r.measurements["layers"]] == [
        (0, False), (1, True), (1, True), (2, False)]
    r = looped([4, None, None], (4, [True, False, True]), [0, 1, 1, 2])   # the last sliding layer lost its window
    assert r.outcome is FAIL and r.cause == "window_ignored", r.detail
    r = looped([4, None, 4], (4, [True, False, True]), [0, 1, 1, 2], named=False)   # no module names: by order only
    assert r.outcome is INCONCLUSIVE and r.cause == "scores_unseen", r.detail


def test_layers_of_no_softmax_attention_between_windows_read_per_call():
    # the scan carries the first tokens to every later query: at the output the windows look ignored
    r = run([4, SCAN, 4], (4, [True, None, True]))
    assert r.outcome is PASS and len(r.measurements["layers"]) == 2, r.detail
    r = run([4, SCAN, None], (4, [True, None, True]))   # the second attention layer lost its window
    assert r.outcome is FAIL and r.cause == "window_ignored", r.detail
    assert [x["far_keys_visible"] > 0 for x in r.measurements["layers"]] == [False, True]


def test_a_window_without_its_layers_is_read_from_the_calls():
    # a window named without the layers that take it (a config with sliding_window alone)
    r = run([4, 4], (4, None))                  # every layer slides: nothing beyond the windows moves
    assert r.outcome is PASS and r.measurements["change"] == 0.0, r.detail
    r = run([4, None], (4, None))               # alternating by design (Gemma2's code before layer_types)
    assert r.outcome is PASS, r.detail
    assert [x["far_keys_visible"] > 0 for x in r.measurements["layers"]] == [False, True]
    r = run([None, None], (4, None))            # the window applied on no layer
    assert r.outcome is FAIL and r.cause == "window_ignored", r.detail
    assert r.measured == 2.0


def test_no_window_declared_is_na():
    r = run([None], None)
    assert r.outcome is NA and r.cause == "no_window"


def test_window_beyond_reach_is_inconclusive():
    r = run([None], (4096, [True]))
    assert r.outcome.value == "inconclusive" and r.cause == "window_too_long"


def cfg(**kw):
    return types.SimpleNamespace(num_hidden_layers=3, **kw)


@pytest.mark.parametrize("config, expected", [
    (cfg(sliding_window=8), (8, None)),                       # a window alone: which layers take it, not said
    (cfg(sliding_window=8, layer_types=["sliding_attention", "full_attention"] * 4), (8, [True, False, True])),
    (cfg(sliding_window=8, use_sliding_window=False, max_window_layers=0), (8, [False, False, False])),
    (cfg(sliding_window=8, use_sliding_window=True, max_window_layers=1), (8, [False, True, True])),
    (cfg(sliding_window=8, layer_types=["linear_attention", "sliding_attention", "conv"]), (8, [None, True, None])),
    # RecurrentGemma before transformers 5.2x: layers_block_type, no layer_types
    (cfg(sliding_window=8, layer_types=None, layers_block_type=["recurrent", "recurrent", "attention"]),
     (8, [None, None, True])),
])
def test_declared_windows_from_a_config(config, expected):
    assert declared_windows(config) == expected


def test_an_attention_kind_of_its_own_is_named_and_counted_not_judged():
    assert declared_windows(cfg(sliding_window=8, layer_types=["indexed_attention", "sliding_attention", "full_attention"])) \
        == (8, ["indexed_attention", True, False])
    r = run([None, 4, None], (4, ["indexed_attention", True, False]))   # the kind's own layer: not judged
    assert r.outcome is PASS and "kinds of its own: indexed_attention" in r.detail, r.detail
    r = run([None, None, None], (4, ["indexed_attention", True, False]))   # the sliding layer lost its window
    assert r.outcome is FAIL and r.cause == "window_ignored", r.detail
    r = run([None, 4], (4, ["indexed_attention", "indexed_attention"]))   # nothing declared to judge
    assert r.outcome.value == "inconclusive" and r.cause == "unreachable", r.detail


def test_no_window_in_the_config_is_unsupported():
    with pytest.raises(Unsupported):
        declared_windows(cfg(sliding_window=None))


class ConfiguredLM(WindowLM):
    """WindowLM carrying its own HF-like `config` (a dataclass-like namespace or a dict), examined
    bare: no Adapter, no transformers; the doctor holds it to the window the config declares."""
    def __init__(self, applied, config):
        super().__init__(applied)
        self.config = config


@pytest.mark.parametrize("config", [
    types.SimpleNamespace(sliding_window=4, layer_types=["sliding_attention", "full_attention"], num_hidden_layers=2),
    {"sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]},
    types.SimpleNamespace(window_size=(4, 0), n_layer=2, layer_types=["sliding_attention", "full_attention"]),
], ids=["namespace", "dict", "window_size"])
def test_a_window_in_a_modules_own_config_is_held_to_bare(config):
    torch.manual_seed(0)
    honest = examine(ConfiguredLM([4, None], config), checks=["sliding_window"], strict=True)["sliding_window"]
    assert honest.outcome is PASS, honest.detail
    dropped = examine(ConfiguredLM([None, None], config), checks=["sliding_window"], strict=True)["sliding_window"]
    assert dropped.outcome is FAIL and dropped.cause == "window_ignored", dropped.detail
    plain = examine(ConfiguredLM([None, None], types.SimpleNamespace(n_layer=2)), checks=["sliding_window"])
    assert plain["sliding_window"].outcome is NA and plain["sliding_window"].cause == "no_window"
