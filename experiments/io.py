"""Atomic file writes: a reader never sees half a file, a crash never leaves one."""
import csv
import json
import os
import tempfile
from pathlib import Path

import torch


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


def read_rows_csv(path) -> list[dict]:
    with open(path) as f:
        return [{k: (float(v) if v != "" else None) for k, v in r.items()} for r in csv.DictReader(f)]


def save_torch(path, obj):
    atomic_write(path, lambda f: torch.save(obj, f), mode="wb")
