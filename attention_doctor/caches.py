"""KV caches a causal LM's forward(ids, ...) keeps, beyond the conventions conventions.py names
(Meta's start_pos, LitGPT's set_kv_cache, gpt-fast's setup_caches(max_batch_size, max_seq_length),
x-transformers' cache=): found by trying what the target accepts, as people write them.

- a set-up method (torchtune's `setup_caches(batch_size, dtype, decoder_max_seq_len=...)`, or
  another `*cache*` method taking the batch size) that puts cache modules in the model, then
  `input_pos` (1-D (T,) or 2-D (B, T), tried in that order) and, where the forward asks for one
  under a cache, a mask of the new rows over the whole cache (B, S, L), as torchtune's generation;
- the presents the forward returns, passed back in (`past_key_values=` with `use_cache=True`:
  presents.py, found by what comes back);
- a cache object passed in (mistral-inference's `cache=BufferCache(...)`, Megatron's
  `inference_params=InferenceParams(...)`, nanochat's `kv_cache=KVCache(...)`): a class the
  argument's annotation names, or one of the model's own code whose name shares a word with the
  argument's, built from the batch and length and the model's attributes by name (head_dim, the
  number of layers), or where a parameter has no value of its name, from each of the model's
  integers that share its words (num_heads: n_kv_head, n_head; the one that runs taken); an integer `*offset*` attribute the model leaves at 0 after
  the prompt is the caller's to advance (Megatron's sequence_len_offset).

A way is taken only when it runs and the new tokens read the prompt (their outputs change with
it); what the set-up changed in the model is put back before any other call (`Snapshot`). What
is found but cannot be driven is described (`cache_things`): the check is inconclusive with it,
never n/a."""
import inspect
import itertools
import re
import sys
import typing

import torch
import torch.nn as nn

from attention_doctor import presents
from attention_doctor.adapters import CACHE_ARGS, _first_output, _params
from attention_doctor.module_state import Snapshot
from attention_doctor.presents import PresentsDrive
from attention_doctor.signals import TargetRaised
from attention_doctor.windows import module_config

CACHE_WORDS = ("cache", "past", "inference_params", "kv", "mems")   # a forward argument that may carry a cache
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


def setup_methods(module) -> list[str]:
    """The module's own methods (not nn.Module's) named like a cache set-up and taking a batch size."""
    out = []
    for name in dir(type(module)):
        if "cache" not in name.lower() or name.startswith("_") or hasattr(nn.Module, name):
            continue
        fn = getattr(module, name, None)
        if callable(fn) and any(any(w in p.lower() for w in BATCH) for p in _params(fn)):
            out.append(name)
    return sorted(out, key=lambda n: not n.startswith("setup"))


def cache_args(accepts, switches=False) -> list[str]:
    """The forward's arguments that may carry a cache; a switch such as use_cache only if switches
    (it says a cache is there, and carries none)."""
    return sorted(a for a in accepts if (a in CACHE_ARGS or any(w in a.lower() for w in CACHE_WORDS))
                  and (switches or not a.startswith("use_")))


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
    "Optional[KVCache]" read in the forward's own module), other than torch's and builtins'."""
    fwd = inspect.unwrap(module.forward)
    try:
        p = inspect.signature(fwd).parameters.get(arg)
    except (TypeError, ValueError):
        return []
    if p is None or p.annotation is p.empty:
        return []
    names = getattr(getattr(fwd, "__func__", fwd), "__globals__", {})
    return [c for c in _classes_in(p.annotation, names)
            if c.__module__.split(".")[0] not in ("torch", "builtins", "typing") and not issubclass(c, nn.Module)]


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


def cache_things(module, accepts) -> list[str]:
    """What in the target looks like a cache: forward arguments, set-up methods, submodules and
    buffers named so."""
    things = [f"forward argument {a}" for a in cache_args(accepts, switches=True)]
    things += [f"method {n}" for n in setup_methods(module)]
    things += [f"module {n} ({type(m).__name__})" for n, m in module.named_modules()
               if n and "cache" in (n.rsplit(".", 1)[-1] + type(m).__name__).lower()][:2]
    things += [f"buffer {n}" for n, _ in module.named_buffers() if "cache" in n.rsplit(".", 1)[-1].lower()][:2]
    return things


def cache_mask(encoding, batch, start, n, length, device, dtype):
    """The new rows start..start+n of a causal mask over a cache of `length` slots."""
    q = torch.arange(start, start + n, device=device)[:, None]
    keep = (torch.arange(length, device=device)[None, :] <= q).expand(batch, n, length)
    if encoding == "keep (B, S, L)":
        return keep
    if encoding == "keep (B, 1, S, L)":
        return keep[:, None]
    return ~keep[:, None]   # "masked-out (B, 1, S, L)"


CACHE_MASKS = ("keep (B, S, L)", "keep (B, 1, S, L)", "masked-out (B, 1, S, L)")


class Drive:
    """One way of driving a found cache: prefill(x) then step(x) on the same state."""

    def __init__(self, adapter, how: dict):
        self.a, self.how = adapter, how

    def start(self, batch, length, snapshot):
        """Set the cache up for a batch and `length` positions (what it changes in the model captured
        in snapshot); the state for the first call."""
        a, how = self.a, self.how
        if how["kind"] == "setup":
            kw, _ = fill(getattr(a.module, how["method"]), a.module, batch, length, a.device, a.dtype)
            try:
                getattr(a.module, how["method"])(**kw)
            finally:
                snapshot.capture()
            return {"pos": 0, "length": length}
        kw, _ = fill(how["cls"], a.module, batch, length, a.device, a.dtype, all_lengths=True, chosen=how.get("chosen"))
        obj = how["cls"](**kw)
        if callable(getattr(obj, "to", None)):
            try:
                obj.to(a.device, a.dtype)
            except (TypeError, RuntimeError, AttributeError):   # no such `to`: its tensors stay as built
                pass
        return {"pos": 0, "length": length, "obj": obj}

    def call(self, state, x):
        a, how, n = self.a, self.how, x.shape[1]
        start = state["pos"]
        kw = {}
        if how["kind"] == "setup":
            pos = torch.arange(start, start + n, device=x.device)
            kw["input_pos"] = pos if how["pos_dims"] == 1 else pos.expand(x.shape[0], -1)
            if how.get("mask"):
                kw[a.mask_name] = cache_mask(how["mask"], x.shape[0], start, n, state["length"], x.device, a.dtype)
        else:
            obj = state["obj"]
            kw[how["arg"]] = obj
        y = _first_output(a._call(x, **kw))
        if how["kind"] == "object" and how.get("offset"):   # the caller advances it (Megatron's text generation)
            setattr(state["obj"], how["offset"], getattr(state["obj"], how["offset"]) + n)
        state["pos"] = start + n
        return y

    def describe(self) -> str:
        how = self.how
        if how["kind"] == "setup":
            return (f"{how['method']}({', '.join(how['filled'])}), then a {how['pos_dims']}-D input_pos"
                    + (f" and {self.a.mask_name} as {how['mask']}" if how.get("mask") else ""))
        return (f"{how['arg']}={how['cls'].__name__}({', '.join(how['filled'])}) passed in"
                + (f", its {how['offset']} advanced by the caller" if how.get("offset") else ""))


def _reads_prompt(drive, x, snapshot) -> bool:
    """The way runs, and the new tokens' outputs change when the prompt does (the cache is read)."""
    n = x.shape[1] // 2
    outs = []
    for prompt in (x[:, :n], x[:, :n].flip(0)):
        try:
            state = drive.start(x.shape[0], x.shape[1], snapshot)
            drive.call(state, prompt)
            outs.append(drive.call(state, x[:, n:]))
        finally:
            snapshot.restore()
    return all(bool(torch.isfinite(o).all()) for o in outs) and not torch.equal(outs[0], outs[1])


def candidates(adapter, x):
    """The ways to try, in order: each set-up method with input_pos 1-D, then 2-D, without a
    mask, then with each cache mask; each cache class for each cache argument."""
    a = adapter
    if "input_pos" in a.accepts:
        for method in setup_methods(a.module):
            kw, missing = fill(getattr(a.module, method), a.module, x.shape[0], x.shape[1], a.device, a.dtype)
            if kw is None:
                yield None, f"{method}: cannot fill its {missing}"
                continue
            masks = (None, *CACHE_MASKS) if a.mask_name else (None,)
            for dims in (1, 2):
                for m in masks:
                    yield {"kind": "setup", "method": method, "filled": sorted(kw), "pos_dims": dims, "mask": m}, None
    for arg in cache_args(a.accepts):
        for cls in cache_classes(a.module, arg):
            ways, missing = fillings(cls, a.module, x.shape[0], x.shape[1], a.device, a.dtype)
            if ways is None:
                yield None, f"{cls.__name__}: cannot fill its {missing}"
                continue
            for chosen, taken in ways:
                kw, _ = fill(cls, a.module, x.shape[0], x.shape[1], a.device, a.dtype, all_lengths=True, chosen=chosen)
                yield {"kind": "object", "arg": arg, "cls": cls, "chosen": chosen,
                       "filled": sorted(f"{k}={taken[k]}" if k in taken else k for k in kw)}, None
        yield from presents.candidates(a, x, arg)


def _offset_to_advance(drive, x, snapshot):
    """An integer *offset* attribute of the cache object the model leaves at 0 after a prompt."""
    try:
        state = drive.start(x.shape[0], x.shape[1], snapshot)
        drive.call(state, x[:, : x.shape[1] // 2])
        left = [k for k, v in vars(state["obj"]).items()
                if "offset" in k and "batch" not in k and isinstance(v, int) and not isinstance(v, bool) and v == 0]
        return next(iter(sorted(left, key=lambda k: not ("seq" in k or "len" in k))), None)
    finally:
        snapshot.restore()


def find_drive(adapter, x):
    """(the first way that runs and reads the prompt, None) or (None, what was tried and why not)."""
    tried = []
    for how, why in candidates(adapter, x):
        if how is None:
            tried.append(why)
            continue
        drive = (PresentsDrive if how["kind"] == "presents" else Drive)(adapter, how)
        snapshot = Snapshot(adapter.module)
        try:
            if how["kind"] == "object" and "offset" not in how:
                how["offset"] = _offset_to_advance(drive, x, snapshot)
            if _reads_prompt(drive, x, snapshot):
                return drive, None
            tried.append(f"{drive.describe()}: the new tokens do not read the prompt")
        except TargetRaised as e:
            tried.append(f"{drive.describe()}: raised {e.error[:80]}")
        except Exception as e:  # noqa: BLE001 -- the set-up or the cache object's own code (not the forward) refused: not this way (said in what was tried), never the doctor's error
            tried.append(f"{drive.describe()}: {type(e).__name__}: {str(e)[:80]}")
    return None, tried
