"""The sliding window a config declares (the sliding_window check reads it): transformers' fields
(`sliding_window`, `layer_types`, `layers_block_type`, `use_sliding_window` / `max_window_layers`)
and the same fields, or `window_size`, on any module's own `config` (a dataclass, a namespace or a
dict: a hand-written model that declares a window is held to it as a transformers model is)."""
from types import SimpleNamespace

import torch

from attention_doctor.signals import Unreachable, Unsupported

SLIDING, FULL = "sliding_attention", "full_attention"
# layer kinds with no softmax attention, hence no attention call of the doctor's: the calls it sees
# are the other layers' (transformers' names in layer_types)
NOT_SOFTMAX = {"linear_attention", "conv", "mamba", "recurrent", "mlp", "moe"}


def declared_windows(cfg) -> tuple[int, list[bool | str | None] | None]:
    """(sliding_window, per layer whether it slides: None where the layer is no softmax attention) as
    a config declares them: its layer_types where it has them (sliding_attention / full_attention /
    a kind of NOT_SOFTMAX; another kind, an attention of its own, stays its name: its calls are
    counted, its window not judged), or its layers_block_type (older releases: `attention` layers take
    the window, `recurrent` / `mamba` ones are NOT_SOFTMAX); else its use_sliding_window switch, from max_window_layers on
    (Qwen2's rule); else None for the layers: a window alone does not say which layers take it
    (Mistral slides every layer; Gemma2 before layer_types alternates in its code; the check reads
    the calls). Unsupported without a window."""
    w = getattr(cfg, "sliding_window", None)
    if w is None:
        w = _left(getattr(cfg, "window_size", None))
    if isinstance(w, bool) or not isinstance(w, int) or w <= 0:
        raise Unsupported("declares no sliding window (its config's sliding_window is not set)", "no_window")
    types, n = getattr(cfg, "layer_types", None), _layer_count(cfg)
    if types is None:   # older releases' name (RecurrentGemma, Jamba before transformers 5.2x): `attention`
        old = getattr(cfg, "layers_block_type", None)   # is a softmax attention layer, which the window is for
        if isinstance(old, (list, tuple)) and old and all(isinstance(t, str) for t in old):
            types = [SLIDING if t == "attention" else t for t in old]
    if isinstance(types, (list, tuple)) and types and all(isinstance(t, str) for t in types):
        types = types[:n] if isinstance(n, int) else types   # the model builds layer i from types[i], i < n
        return w, [None if t in NOT_SOFTMAX else t == SLIDING if t in (SLIDING, FULL) else t for t in types]
    if hasattr(cfg, "use_sliding_window"):
        if not isinstance(n, int):
            raise Unreachable("use_sliding_window but no num_hidden_layers: the layers it applies to are unknown")
        first = getattr(cfg, "max_window_layers", None)
        return w, [bool(cfg.use_sliding_window) and (not isinstance(first, int) or i >= first) for i in range(n)]
    return w, None


LAYER_COUNTS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")   # the names configs give it


def _layer_count(cfg):
    return next((n for n in (getattr(cfg, k, None) for k in LAYER_COUNTS) if isinstance(n, int)), None)


def _left(w):
    """A window_size as flash-attn's (left, right) pair gives it (left keys back), or an int."""
    if isinstance(w, (tuple, list)) and len(w) == 2 and all(isinstance(x, int) for x in w):
        return w[0] if w[0] >= 0 else None
    return w


def module_config(module):
    """A module's own `config` as attributes (a dict read as one), or None without one."""
    cfg = getattr(module, "config", None)
    if isinstance(cfg, dict):
        return SimpleNamespace(**{k: v for k, v in cfg.items() if isinstance(k, str)})
    return cfg


def layer_names(module: torch.nn.Module, n: int) -> list[str] | None:
    """The decoder layers a declaration of n layers speaks of: the one ModuleList of the model with n
    entries, all of one class (transformers builds layer i from layer_types[i]); None where there is
    not exactly one."""
    lists = [(name, m) for name, m in module.named_modules() if isinstance(m, torch.nn.ModuleList)
             and len(m) == n and len({type(x) for x in m}) == 1]
    if len(lists) != 1:
        return None
    name, _ = lists[0]
    return [f"{name}.{i}" if name else str(i) for i in range(n)]
