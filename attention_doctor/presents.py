"""A KV cache the forward returns and takes back: `forward(idx, past_key_values=None, use_cache=False)
-> (logits, presents)`, as hand-written GPT-2 forks, AllenAI's OLMo (a NamedTuple with the presents
after the logits) and DeepSeek-V2-style latent attention (per layer a latent and a rope key) write
it. Found by measurement, never by a project's name: with its `use_*cache*` switch on (where the
forward has one), a part of the output other than the logits (a tuple's later items, a NamedTuple's
or an object's fields) is taken for the presents where it holds, per layer, a tensor or a tuple of
tensors that each have an axis as long as the tokens given; passed back in with new tokens, the
part that comes back along that axis holds the tokens so far (grown, tried first) or the new ones
only. caches.find_drive takes a way only where it runs and the new tokens read the prompt."""
from collections.abc import Mapping

import torch

from attention_doctor.adapters import _first_output
from attention_doctor.signals import TargetRaised


def output_parts(out) -> list:
    """What a forward returned besides its logits, in order."""
    if hasattr(out, "_fields"):   # a NamedTuple
        return [getattr(out, f) for f in out._fields if f != "logits"]
    if isinstance(out, (tuple, list)):
        return list(out[1:])
    fields = dict(out) if isinstance(out, Mapping) else getattr(out, "__dict__", {})
    return [v for k, v in fields.items() if k != "logits"] if hasattr(out, "logits") else []


def _tensors(layer) -> list | None:
    if isinstance(layer, torch.Tensor):
        return [layer]
    if isinstance(layer, (tuple, list)) and layer and all(isinstance(t, torch.Tensor) for t in layer):
        return list(layer)
    return None


def time_axes(part, length) -> list[list[set[int]]] | None:
    """Per layer, per tensor, the axes of `length` in a part that holds per layer a tensor or a tuple
    of tensors, each with at least one such axis; None for any other part."""
    if not isinstance(part, (tuple, list)) or not part:
        return None
    out = []
    for layer in part:
        ts = _tensors(layer)
        if ts is None:
            return None
        axes = [{i for i, s in enumerate(t.shape) if s == length} for t in ts]
        if not all(axes):
            return None
        out.append(axes)
    return out


def _along(before, after, length) -> bool:
    """after has before's layers and tensors, each with `length` on an axis where before had its time axis."""
    if not isinstance(after, (tuple, list)) or len(after) != len(before):
        return False
    for axes, layer in zip(before, after):
        ts = _tensors(layer)
        if ts is None or len(ts) != len(axes) or not all(any(t.shape[i] == length for i in a if i < t.dim())
                                                         for a, t in zip(axes, ts)):
            return False
    return True


def given_positions(adapter, start, x) -> dict:
    """The position ids a forward requires (CallableLM's ids_required), counted on from `start` as a
    caller decoding with the cache gives them; {} where it requires none (its own are its own)."""
    if not getattr(adapter, "ids_required", False):
        return {}
    return {adapter.pos_name: torch.arange(start, start + x.shape[1], device=x.device).expand(x.shape[0], -1)}


def switch_of(accepts) -> str | None:
    """The forward's switch that turns the returned cache on (use_cache), if it has one."""
    return next((a for a in sorted(accepts) if a.startswith("use_") and "cache" in a), None)


def candidates(adapter, x, arg):
    """(how, None) for each part of the output that may be the presents passed back through `arg`
    (grown ones first), or (None, why not) where none is."""
    switch = switch_of(adapter.accepts)
    P, n = x.shape[1] // 2, 3
    on = {switch: True} if switch else {}
    try:
        parts = output_parts(adapter._call(x[:, :P], **on))
        found = [(i, axes) for i, axes in ((i, time_axes(p, P)) for i, p in enumerate(parts)) if axes]
        grown, new_only = [], []
        for i, axes in found:
            step = x[:, P:P + n]
            later = output_parts(adapter._call(step, **on, **{arg: parts[i]}, **given_positions(adapter, P, step)))
            if i < len(later) and _along(axes, later[i], P + n):
                grown.append(i)
            elif i < len(later) and _along(axes, later[i], n):
                new_only.append(i)
    except (TargetRaised, TypeError) as e:   # the forward refused the switch or the part: not this way (said)
        yield None, f"{arg}: the presents: {type(e).__name__} {str(getattr(e, 'error', e))[:80]}"
        return
    if not grown + new_only:
        yield None, (f"{arg}: no part of the output{' with ' + switch + '=True' if switch else ''} holds per layer "
                     "tensors along the tokens given that come back along the tokens when passed in")
    for i in grown + new_only:
        yield {"kind": "presents", "arg": arg, "switch": switch, "part": i, "grown": i in grown,
               "layers": len(parts[i]), "per_layer": len(_tensors(parts[i][0]))}, None


class PresentsDrive:
    """prefill(x) then step(x): the presents of each call passed back in with the next."""

    def __init__(self, adapter, how: dict):
        self.a, self.how = adapter, how

    def start(self, batch, length, snapshot):
        return {"pos": 0, "past": None}

    def call(self, state, x):
        how = self.how
        kw = {how["switch"]: True} if how["switch"] else {}
        if state["past"] is not None:
            kw[how["arg"]] = state["past"]
        out = self.a._call(x, **kw, **given_positions(self.a, state["pos"], x))
        state["past"] = output_parts(out)[how["part"]]
        state["pos"] += x.shape[1]
        return _first_output(out)

    def describe(self) -> str:
        how = self.how
        return (f"{how['arg']}= the presents it returns (part {how['part'] + 1} after the logits"
                + (f", with {how['switch']}=True" if how["switch"] else "")
                + f": {how['layers']} layer(s) of {how['per_layer']} tensor(s) along the tokens, "
                + ("grown by each call" if how["grown"] else "the new tokens' only") + ") passed back in"
                + (" (read on a copy with its zero weight matrices filled: its own outputs do not show the prompt)"
                   if how.get("filled_copy") else ""))
