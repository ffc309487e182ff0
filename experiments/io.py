"""Atomic file writes: a reader never sees half a file, a crash never leaves one; and a lock on a
directory that leaves nothing behind."""
import csv
import fcntl
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from experiments.layout import LOCK


def atomic_write(path: Path, write, mode="w"):
    """write(f) into a temp file beside `path`, fsync, then rename over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@contextmanager
def dir_lock(d: Path):
    """Hold d/LOCK (.lock) exclusively (across processes) while the block runs; d is made if missing. On
    leaving, if d holds nothing but the lock, both go, so a finished run leaves no empty dir. A
    process that waited on a lock file removed meanwhile takes the lock again on a fresh one."""
    d = Path(d)
    while True:
        d.mkdir(parents=True, exist_ok=True)
        try:
            f = open(d / LOCK, "a")
        except FileNotFoundError:  # d was removed between the two calls
            continue
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            if os.fstat(f.fileno()).st_ino == os.stat(d / LOCK).st_ino:
                break
        except FileNotFoundError:
            pass
        f.close()  # the lock's file was removed while we waited: its holder is done with d
    try:
        yield
    finally:
        try:
            if [p.name for p in d.iterdir()] == [LOCK]:
                (d / LOCK).unlink()
                d.rmdir()
        finally:
            f.close()


def write_text(path, text: str):
    atomic_write(path, lambda f: f.write(text))


def write_json(path, obj):
    atomic_write(path, lambda f: json.dump(obj, f, indent=2, default=_jsonable))


def _jsonable(x):
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def write_rows_csv(path, rows: list[dict]):
    """Wide CSV: one row per logged step, the union of keys as columns (first-seen order)."""
    cols: dict[str, None] = {"step": None}  # a run that logged nothing still gets a readable header
    for r in rows:
        cols.update(dict.fromkeys(r))

    def write(f):
        w = csv.DictWriter(f, fieldnames=list(cols), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    atomic_write(path, write)


def save_torch(path, obj):
    import torch  # the report reads run dirs without torch
    atomic_write(path, lambda f: torch.save(obj, f), mode="wb")


# attn_weights.npz: the weights of example 0 at each diagnostic step, one array per layer of shape
# (n_steps, h, T_q, T_k) in float16 (a picture's precision; weights outside +-65504, possible only
# for normalize_by_sum, read as inf) plus `steps`. One array per layer, not per (step, layer), so
# the file is its contents plus a few hundred bytes of zip headers.

def _stack(ws: list) -> np.ndarray:
    """Steps of different lengths (text lines padded per batch) stacked, NaN beyond each step's T."""
    T_q, T_k = max(w.shape[-2] for w in ws), max(w.shape[-1] for w in ws)
    return np.stack([np.pad(w, [(0, 0)] * (w.ndim - 2) + [(0, T_q - w.shape[-2]), (0, T_k - w.shape[-1])],
                            constant_values=np.nan) for w in ws])


def save_attn_weights(path, weights: dict):
    """{step: {layer: (h, T_q, T_k)}} -> attn_weights.npz, every array copied out to float16."""
    steps = sorted(weights)
    layers = sorted(weights[steps[0]]) if steps else []
    arrays = {layer: _stack([np.asarray(weights[s][layer], dtype=np.float16) for s in steps]) for layer in layers}
    atomic_write(path, lambda f: np.savez(f, steps=np.asarray(steps, dtype=np.int64), **arrays), mode="wb")


def load_attn_weights(path) -> dict:
    """attn_weights.npz -> {step: {layer: (h, T_q, T_k) float16 array}}."""
    with np.load(path) as z:
        layers = {k: z[k] for k in z.files if k != "steps"}
        return {int(s): {layer: a[i] for layer, a in layers.items()} for i, s in enumerate(z["steps"])}
