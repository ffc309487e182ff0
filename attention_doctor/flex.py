"""FlexAttention (torch.nn.attention.flex_attention) as a notation the probe sees.

flex_attention is a Python function with no torch-function dispatch of its own (its kernel runs
under torch.compile), so a TorchFunctionMode sees nothing of a call that it can read. The probe
sees it where the target's code reaches it: every name bound to that function (or to a
torch.compile of it) in a loaded module's namespace is swapped, for the length of a probe, for a
wrapper that hands the call to the probe. Which calls are flex is decided by identity, never by
a name.

The scores are then measured densely, forward-only, as torch's own eager implementation computes
them (torch._higher_order_ops.flex_attention.math_attention): q k^T * scale, the score_mod applied
at every (b, h, q_idx, kv_idx), -inf wherever the BlockMask's mask_mod is False."""
import functools
import inspect
import sys
import types
from contextlib import contextmanager

import torch

MODULE = "torch.nn.attention.flex_attention"
_homes_cache = {"modules": -1, "homes": []}


def function():
    """torch's flex_attention, or None where no code has imported it (then nothing can call it)."""
    mod = sys.modules.get(MODULE)
    return None if mod is None else getattr(mod, "flex_attention", None)


def _origin(v):
    """The function v stands for: through the doctor's own wrappers and torch.compile's."""
    for _ in range(8):
        if type(v) is not types.FunctionType:
            return v
        inner = getattr(v, "_doctor_flex", None) or getattr(v, "_torchdynamo_orig_callable", None)
        if inner is None:
            return v
        v = inner
    return v


def _homes(fa) -> list[tuple[dict, str]]:
    """(namespace, name) of every loaded module's global bound to fa (found again when modules were imported)."""
    if _homes_cache["modules"] != len(sys.modules):
        homes = []
        for mod in list(sys.modules.values()):
            d = getattr(mod, "__dict__", None)
            if isinstance(d, dict):
                homes += [(d, k) for k, v in list(d.items()) if v is fa or (
                    type(v) is types.FunctionType and _origin(v) is fa)]
        _homes_cache.update(modules=len(sys.modules), homes=homes)
    return _homes_cache["homes"]


@contextmanager
def intercepted(handle):
    """For the block, each call of flex_attention through a module's global calls handle(fn, args,
    kwargs), fn the function the name was bound to (handle calls it)."""
    fa = function()
    swapped, on = [], [True]   # a wrapper kept past the block (compiled by code run inside it) passes calls through
    if fa is not None:
        for d, k in _homes(fa):
            fn = d.get(k)
            if fn is not fa and _origin(fn) is not fa:
                continue

            def wrapper(*args, _fn=fn, **kwargs):
                return handle(_fn, args, kwargs) if on[0] else _fn(*args, **kwargs)
            functools.update_wrapper(wrapper, fn)
            wrapper._doctor_flex = fn
            d[k] = wrapper
            swapped.append((d, k, fn, wrapper))
    try:
        yield
    finally:
        on[0] = False
        for d, k, fn, wrapper in reversed(swapped):
            if d.get(k) is wrapper:
                d[k] = fn


@functools.cache
def _signature():
    return inspect.signature(function())


def arguments(args, kwargs) -> dict:
    """flex_attention's arguments by name (query, key, value, score_mod, block_mask, scale, enable_gqa, ...)."""
    bound = _signature().bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def with_arguments(a: dict) -> tuple[tuple, dict]:
    """(args, kwargs) to call flex_attention with the arguments `a` (by name)."""
    params = _signature().parameters
    pos = [n for n, p in params.items() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    return tuple(a[n] for n in pos), {n: a[n] for n in a if n not in pos}


def mods(score_mod, block_mask):
    """s (B, h, T_q, T_k) -> the scores flex's softmax gets: score_mod(s, b, h, q_idx, kv_idx) where
    the mask_mod keeps the key, -inf elsewhere (torch's eager math: the BlockMask's mask_mod at every
    entry; its block sparsity is the kernels' shortcut for the same mask)."""
    mask_mod = getattr(block_mask, "mask_mod", None)

    def apply(s):
        from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
        from torch.nn.attention.flex_attention import _vmap_for_bhqkv
        idx = [torch.arange(n, device=s.device) for n in s.shape]
        with torch.no_grad(), TransformGetItemToIndex():
            if score_mod is not None:
                s = _vmap_for_bhqkv(score_mod, prefix=(0,))(s, *idx).to(s.dtype)
            if mask_mod is not None:
                keep = _vmap_for_bhqkv(mask_mod, prefix=())(*idx)
                s = s.masked_fill(~keep.expand(s.shape), float("-inf"))
        return s
    return apply


def weights(s) -> torch.Tensor:
    """softmax over the keys, a row with no visible key 0 (flex's output there is 0, not NaN)."""
    w = torch.softmax(s, dim=-1)
    return w.masked_fill(torch.isneginf(s).all(-1, keepdim=True), 0.0)
