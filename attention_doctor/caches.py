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
  `inference_params=InferenceParams(...)`, nanochat's `kv_cache=KVCache(...)`), built as
  cache_params.py says; an integer `*offset*` attribute the model leaves at 0 after the prompt is
  the caller's to advance (Megatron's sequence_len_offset).

A way is taken only when it runs and the new tokens read the prompt (their outputs change with
it; where no way's do, on the doctor's copy with its all-zero weight matrices filled, as the checks
see it: nanochat's zero output projections let no output show the prompt); what the set-up changed in the model is put back before any other call (`Snapshot`). What
is found but cannot be driven is described (`cache_things`): the check is inconclusive with it,
never n/a."""
import copy

import torch
import torch.nn as nn

from attention_doctor import presents
from attention_doctor.adapters import CACHE_ARGS, _first_output, _params, deep_copy, target_scope
from attention_doctor.cache_params import BATCH, cache_classes, fill, fillings
from attention_doctor.module_state import Snapshot
from attention_doctor.presents import PresentsDrive, given_positions
from attention_doctor.sensitivity import fill_zero_matrices
from attention_doctor.signals import TargetRaised

CACHE_WORDS = ("cache", "past", "inference_params", "kv", "mems")   # a forward argument that may carry a cache


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


FILLED = " (read on a copy with its zero weight matrices filled: its own outputs do not show the prompt)"


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
            kw[how["arg"]] = state["obj"]
            kw.update(given_positions(self.a, start, x))
        y = _first_output(a._call(x, **kw))
        if how["kind"] == "object" and how.get("offset"):   # the caller advances it (Megatron's text generation)
            setattr(state["obj"], how["offset"], getattr(state["obj"], how["offset"]) + n)
        state["pos"] = start + n
        return y

    def describe(self) -> str:
        how = self.how
        if how["kind"] == "setup":
            said = (f"{how['method']}({', '.join(how['filled'])}), then a {how['pos_dims']}-D input_pos"
                    + (f" and {self.a.mask_name} as {how['mask']}" if how.get("mask") else ""))
        else:
            said = (f"{how['arg']}={how['cls'].__name__}({', '.join(how['filled'])}) passed in"
                    + (f", its {how['offset']} advanced by the caller" if how.get("offset") else ""))
        return said + FILLED * bool(how.get("filled_copy"))


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
        snapshot = Snapshot(a.module)   # what the measuring calls change in the model is put back
        try:
            found = list(presents.candidates(a, x, arg))
        finally:
            snapshot.capture()
            snapshot.restore()
        yield from found


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


def _drive(adapter, how):
    return (PresentsDrive if how["kind"] == "presents" else Drive)(adapter, how)


def find_drive(adapter, x):
    """(the first way that runs and reads the prompt, None) or (None, what was tried and why not).
    Ways that run and whose new tokens' outputs do not move with the prompt are tried again on a
    copy with its all-zero weight matrices filled (sensitivity.py), where outputs cannot move by
    construction; the first that reads the prompt there is taken, and says so."""
    tried, quiet = [], []
    for how, why in candidates(adapter, x):
        if how is None:
            tried.append(why)
            continue
        drive, snapshot = _drive(adapter, how), Snapshot(adapter.module)
        try:
            if how["kind"] == "object" and "offset" not in how:
                how["offset"] = _offset_to_advance(drive, x, snapshot)
            if _reads_prompt(drive, x, snapshot):
                return drive, None
            tried.append(f"{drive.describe()}: the new tokens do not read the prompt")
            quiet.append(how)
        except TargetRaised as e:
            tried.append(f"{drive.describe()}: raised {e.error[:80]}")
        except Exception as e:  # noqa: BLE001 -- the set-up or the cache object's own code (not the forward) refused: not this way (said in what was tried), never the doctor's error
            tried.append(f"{drive.describe()}: {type(e).__name__}: {str(e)[:80]}")
    found = _read_when_filled(adapter, x, quiet) if quiet else None
    if found is not None:
        return _drive(adapter, found), None
    return None, tried + (["nor on a copy with its zero weight matrices filled"] if quiet else [])


def _read_when_filled(adapter, x, hows):
    """The first of `hows` whose new tokens read the prompt on a twin of the adapter whose module is
    a copy with its all-zero weight matrices filled; None where none does or nothing is zero."""
    twin = copy.copy(adapter)
    twin.module, twin._live = deep_copy(adapter.module), None
    if getattr(adapter.module.__dict__.get("forward"), "_doctor_target", False):
        twin.module.__dict__.pop("forward", None)   # the doctor's wrapper of the original's forward, copied with it
    if not fill_zero_matrices(twin.module, 0):
        return None
    with target_scope(twin.module):
        for how in hows:
            try:
                if _reads_prompt(_drive(twin, how), x, Snapshot(twin.module)):
                    return {**how, "filled_copy": True}
            except Exception:  # noqa: BLE001 -- it ran on the model itself: a raise on the copy is not this way, said as not read
                continue
    return None
