"""What a found cache is built with: the classes that may hold a cache (named by the forward's
annotation, or of the model's own code and named like one), and the arguments of a cache class or a
set-up method, filled by their names (the batch, the length, the dtype, the device, the model's own
attribute of that name, the number of layers) or, where a parameter has no value of its name, from
the model's integers that share its words (nanochat's KVCache(num_heads=...) takes n_kv_head): each
such way is tried, and the one that runs and reads the prompt is taken (caches.find_drive)."""
import inspect
import itertools
import re
import sys
import typing

import torch.nn as nn

from attention_doctor.windows import module_config

# a forward argument name fragment -> what the doctor passes for it (names choose what to try)
BATCH, LENGTH = ("batch", "bsz"), ("seq", "len", "length", "max_pos")
NOT_LENGTH = ("encoder", "rope", "cross")   # a length of something else


def _model_attr(module, name):
    """An integer attribute `name` of the module or one of its submodules (the first found)."""
    for m in module.modules():
        v = getattr(m, name, None)   # an instance's, or its class's
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _layer_count(module) -> int:
    """The longest ModuleList / ModuleDict: the model's layers."""
    return max((len(m) for m in module.modules() if isinstance(m, (nn.ModuleList, nn.ModuleDict))), default=0)


def fill(fn, module, batch, length, device, dtype, all_lengths=False, chosen=None):
    """kwargs for fn by what its parameters are named: the batch, the length, the dtype, the device,
    the model's own integer attribute of that name, the number of layers, else a value `chosen` for
    it (guesses()); a parameter with a default is left to it unless it is a length (or all_lengths).
    Returns (kwargs, None) or (None, the parameter it cannot fill)."""
    chosen = chosen or {}
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None, "its signature"
    kw = {}
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        n, required = p.name.lower(), p.default is p.empty
        if any(w in n for w in BATCH):
            kw[p.name] = batch
        elif "dtype" in n:
            kw[p.name] = dtype
        elif "device" in n:
            kw[p.name] = device
        elif _model_attr(module, p.name) is not None and required:
            kw[p.name] = _model_attr(module, p.name)
        elif "layer" in n and required and _layer_count(module):
            kw[p.name] = _layer_count(module)
        elif any(w in n for w in LENGTH) and not any(w in n for w in NOT_LENGTH) and (required or all_lengths or "max" in n):
            kw[p.name] = length
        elif p.name in chosen:
            kw[p.name] = chosen[p.name]
        elif required:
            return None, p.name
    return kw, None


CLASS_WORDS = ("cache", "params", "state", "memory", "past")   # a class that may hold a cache


def cache_classes(module, arg) -> list[type]:
    """The classes the forward's annotation of arg names (annotated_classes), then the classes of the
    model's own code (the modules its classes come from, and the modules of their package already
    imported: not torch's) named like a cache holder whose name shares a word with arg's (nothing
    else is built)."""
    words = [w for w in arg.lower().split("_") if len(w) > 2 and w not in ("use", "key", "values")]
    out = annotated_classes(module, arg)
    for mod in _own_modules(module):
        for name, obj in vars(mod).items():
            if (isinstance(obj, type) and not issubclass(obj, nn.Module) and obj.__module__ == mod.__name__
                    and any(w in name.lower() for w in words) and any(w in name.lower() for w in CLASS_WORDS)
                    and obj not in out):
                out.append(obj)
    return out


def _own_modules(module) -> list:
    """The Python modules of the model's own classes (not torch's), then the other modules of their
    packages already imported (a cache class beside the model, as nanochat's engine.py is to gpt.py)."""
    mods = []
    for m in module.modules():
        mod = sys.modules.get(type(m).__module__)
        if mod is not None and mod.__name__.split(".")[0] not in ("torch", "builtins") and mod not in mods:
            mods.append(mod)
    packages = {mod.__name__.rsplit(".", 1)[0] + "." for mod in mods if "." in mod.__name__}
    return mods + [m for name, m in sorted(sys.modules.items()) if m is not None and m not in mods
                   and any(name.startswith(p) for p in packages)]


def annotated_classes(module, arg) -> list[type]:
    """The classes the forward's annotation of `arg` names (`kv_cache: KVCache | None`, or the string
    "Optional[KVCache]" read in the forward's own module), then its default's class, other than
    torch's and builtins'."""
    fwd = inspect.unwrap(module.forward)
    try:
        p = inspect.signature(fwd).parameters.get(arg)
    except (TypeError, ValueError):
        return []
    if p is None:
        return []
    names = getattr(getattr(fwd, "__func__", fwd), "__globals__", {})
    found = [] if p.annotation is p.empty else _classes_in(p.annotation, names)
    found += [] if p.default is p.empty or p.default is None else [type(p.default)]
    return [c for i, c in enumerate(found) if c not in found[:i] and not issubclass(c, nn.Module)
            and c.__module__.split(".")[0] not in ("torch", "builtins", "typing")]


def _classes_in(ann, names) -> list[type]:
    if isinstance(ann, type):
        return [ann]
    if isinstance(ann, str):
        found = []
        for word in re.findall(r"[A-Za-z_][\w.]*", ann):
            obj = names.get(word.split(".")[0])
            for part in word.split(".")[1:]:
                obj = getattr(obj, part, None)
            if isinstance(obj, type):
                found.append(obj)
        return found
    return [c for a in typing.get_args(ann) for c in _classes_in(a, names)]


GENERIC = ("num", "n", "nb", "max", "total")   # words that say "a count of", not of what
KV_WORDS = ("kv", "key", "local")   # a cache holds the key/value heads: counts of those are tried first


def _words(name) -> set[str]:
    return {w[:-1] if w.endswith("s") and len(w) > 3 else w for w in name.lower().split("_") if w}


def _integers(module) -> dict[str, int]:
    """The model's positive integer attributes by name: its config's, then its modules'."""
    cfg = module_config(module)
    sources = ([vars(cfg)] if hasattr(cfg, "__dict__") else []) + [vars(m) for m in module.modules()]
    out = {}
    for src in sources:
        for k, v in src.items():
            if isinstance(v, int) and not isinstance(v, bool) and v > 0 and not k.startswith("_"):
                out.setdefault(k, v)
    return out


def guesses(module, param, most=3) -> list[tuple[str, int]]:
    """(name, value) of the model's integers (its config's, its modules' attributes) whose name has
    every word of param's but the generic ones (num_heads: n_head, n_kv_head, num_key_value_heads,
    head_dim), distinct values, a count of key/value ones first, then the names with fewest other
    words: which one the cache takes is measured (the way that runs and reads the prompt)."""
    want = _words(param) - set(GENERIC)
    if not want:
        return []
    found = [(k, v) for k, v in _integers(module).items() if want <= _words(k)]
    found.sort(key=lambda kv: (not _words(kv[0]) & set(KV_WORDS), len(_words(kv[0]) - want)))
    out = []
    for k, v in found:
        if v not in [w for _, w in out]:
            out.append((k, v))
    return out[:most]


def fillings(cls, module, batch, length, device, dtype, most=8):
    """Each way to fill a cache class's parameters: fill()'s, and where a required one has no value by
    its name, each of its guesses (at most `most` ways). ([(chosen values, what they were taken
    from)], None) or (None, the parameter with no value)."""
    options = {}
    while True:
        kw, missing = fill(cls, module, batch, length, device, dtype, all_lengths=True,
                           chosen={k: v[0][1] for k, v in options.items()})
        if kw is not None:
            break
        g = guesses(module, missing) if missing != "its signature" else []
        if not g or missing in options:
            return None, missing
        options[missing] = g
    ways = itertools.islice(itertools.product(*options.values()), most)
    return [({p: v for p, (_, v) in zip(options, way)}, {p: n for p, (n, _) in zip(options, way)}) for way in ways], None
