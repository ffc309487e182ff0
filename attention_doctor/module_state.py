"""A model's modules as objects (attributes, children, buffers, parameters: which objects, not
their values), taken before the doctor changes them and put back after: a cache set-up that
puts a KVCache in every layer (gpt-fast's setup_caches) must not leak into the next call or the
next check. Buffers written in place stay so."""
from contextlib import contextmanager

import torch.nn as nn

MISSING = object()
PLACES = ("__dict__", "_modules", "_buffers", "_parameters")


class Snapshot:
    """What changed in the modules between the snapshot and capture(), put back by restore().
    By default the public attributes only, so that what the doctor changes on purpose meanwhile
    (train/eval, its own forward wrappers) is left alone; `whole=True` takes every attribute."""

    def __init__(self, module: nn.Module, whole: bool = False):
        self.whole = whole
        self.before = [(m, self._state(m)) for m in module.modules()]
        self.changed = []

    def _state(self, m):
        attrs = {k: v for k, v in m.__dict__.items()
                 if self.whole or (not k.startswith("_") and k not in ("forward", "training"))}
        return {"__dict__": attrs, "_modules": dict(m._modules), "_buffers": dict(m._buffers),
                "_parameters": dict(m._parameters)}

    def capture(self):
        self.changed = []
        for m, old in self.before:
            now = self._state(m)
            for where in PLACES:
                was, is_ = old[where], now[where]
                for k in set(was) | set(is_):
                    if was.get(k, MISSING) is not is_.get(k, MISSING):
                        self.changed.append((m, where, k, was.get(k, MISSING)))

    def restore(self):
        for m, where, k, was in self.changed:
            d = m.__dict__ if where == "__dict__" else getattr(m, where)
            if was is MISSING:
                d.pop(k, None)
            else:
                d[k] = was
        self.changed = []


@contextmanager
def restored(root: nn.Module):
    """The modules under root exactly as they were before the block (every attribute)."""
    snapshot = Snapshot(root, whole=True)
    try:
        yield
    finally:
        snapshot.capture()
        snapshot.restore()
