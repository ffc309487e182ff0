"""Checkpoints: everything a killed run needs to continue as if never stopped (model, optimizer,
scheduler, step, every RNG state), written atomically.

ckpt.pt holds what resuming needs and is the same size at every step. What grows with the step
count (the logged rows, the recorded attention weights) goes beside it, one chunk per checkpoint
holding only what was logged since the previous one: nothing is rewritten.

A damaged checkpoint (truncated by a full disk or a copy off a cluster) loses nothing: a new
ckpt.pt is written beside the old one, read back, and only then takes its place, the old one
kept as ckpt.prev.pt. Resuming tries ckpt.pt, then ckpt.prev.pt; a file that does not load is
named in one line on stderr and set aside as NAME.damaged (kept, for a look), and the run
resumes from the good one, or restarts from step 0 when none is left.
"""
import io
import os
import random
import sys
from pathlib import Path

import torch

from experiments.io import save_torch


def state(trainer) -> dict:
    return {"model": trainer.model.state_dict(), "optim": trainer.optim.state_dict(),
            "sched": trainer.sched.state_dict(), "step": trainer.step,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}}


def save(trainer) -> None:
    if trainer.ckpt_path is None:
        return
    since = trainer.chunked_upto
    rows = [r for r in trainer.res.rows if since <= r["step"] < trainer.step]
    weights = {s: w for s, w in trainer.res.attn_weights.items() if since <= s < trainer.step}
    # the chunk first: a kill between the two leaves a chunk newer than ckpt.pt, ignored on resume
    save_torch(chunk_path(trainer.ckpt_path, trainer.step), {"since": since, "rows": rows, "attn_weights": weights})
    write_verified(trainer.ckpt_path, state(trainer))
    trainer.chunked_upto = trainer.step


def prev_path(ckpt_path: Path) -> Path:
    return Path(ckpt_path).with_name("ckpt.prev.pt")


def write_verified(path: Path, obj) -> None:
    """obj -> path: written to path.new, synced and read back; then the old file becomes
    ckpt.prev.pt and the new one takes its place. A kill at any point leaves a whole checkpoint."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    data, path = buf.getvalue(), Path(path)
    new = path.with_name(path.name + ".new")
    with open(new, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if new.read_bytes() != data:
        raise OSError(f"checkpoint {new}: what was read back differs from what was written")
    if path.exists():
        os.replace(path, prev_path(path))
    os.replace(new, path)


def aside_name(p: Path) -> Path:
    """Where a damaged file is set aside: NAME.damaged (NAME.damaged-2, ... if taken)."""
    dest, n = p.with_name(p.name + ".damaged"), 1
    while dest.exists():
        n += 1
        dest = p.with_name(f"{p.name}.damaged-{n}")
    return dest


class Unusable(Exception):
    def __init__(self, path: Path, why: str, damaged: bool = True):
        super().__init__(why)
        self.path, self.why, self.damaged = Path(path), why, damaged


def _torch_load(p: Path, device=None):
    try:
        return torch.load(p, map_location=device, weights_only=False)
    except Exception as e:  # noqa: BLE001  whatever torch.load raises on a bad file: Unusable, naming the file
        raise Unusable(p, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}") from None


def _load(ckpt: Path, device, bad: set = frozenset()) -> dict:
    """A checkpoint and the chain of chunks behind it (each names the step it starts at), all read
    before anything is applied; raises Unusable naming the file that failed. Chunks in `bad`
    (found damaged, not yet set aside) count as missing."""
    s = _torch_load(ckpt, device)
    if not isinstance(s, dict) or not {"model", "optim", "sched", "step", "rng"} <= set(s):
        raise Unusable(ckpt, "not a checkpoint (keys missing)")
    found = {int(p.stem[4:]): p for p in chunks(ckpt) if p not in bad}
    parts, at = [], s["step"]
    while at > 0:
        if at not in found:
            raise Unusable(ckpt, f"its log chunk {chunk_path(ckpt, at).name} is missing", damaged=False)
        c = _torch_load(found[at])
        parts.append(c)
        # chunks written before `since` was recorded follow each other in step order
        at = c.get("since", max((k for k in found if k < at), default=0))
    rows, weights = [], {}
    for c in reversed(parts):
        rows += c["rows"]
        weights.update(c["attn_weights"])
    return {**s, "rows": rows, "attn_weights": weights, "file": ckpt}


def _good_state(ckpt_path: Path, device) -> tuple[dict | None, list[Unusable]]:
    """The newest checkpoint that loads whole (ckpt.pt, else ckpt.prev.pt) or None, and the
    Unusable of each file met on the way. Nothing is renamed here: resume names them first."""
    unusable, bad = [], set()
    for cand in (Path(ckpt_path), prev_path(ckpt_path)):
        while cand.exists() and cand not in bad:
            try:
                return _load(cand, device, bad), unusable
            except Unusable as e:
                unusable.append(e)
                if not e.damaged:  # whole, but its log is gone: the older checkpoint, if any
                    break
                bad.add(e.path)  # damaged: a chunk (try its checkpoint again without it) or cand itself
    return None, unusable


def resume(trainer) -> bool:
    """Load the newest good checkpoint (and its chunks) into the trainer; True if there was one.
    Each damaged file is named in one line on stderr, the last one saying where the run goes on,
    and only then set aside: a kill between the two leaves it in place, and the next start names
    it again (set aside first, a kill before the line would leave it named nowhere)."""
    if trainer.ckpt_path is None:
        return False
    s, unusable = _good_state(trainer.ckpt_path, trainer.device)
    step = s["step"] if s is not None else 0
    then = f"resuming from {s['file'].name} at step {step}" if s else "restarting from step 0"
    aside = [aside_name(e.path) if e.damaged else None for e in unusable]
    for i, (e, dest) in enumerate(zip(unusable, aside)):
        what = f"set aside as {dest.name}" if dest else "not used"
        print(f"checkpoint: {e.path} is damaged ({e.why}); {what}" + (f"; {then}" if i == len(unusable) - 1 else ""),
              file=sys.stderr, flush=True)
    for e, dest in zip(unusable, aside):
        if dest:
            os.replace(e.path, dest)
    for p in chunks(trainer.ckpt_path):  # a lost future's log: would be rewritten anyway
        if int(p.stem[4:]) > step:
            p.unlink()
    if s is None:
        return False
    trainer.model.load_state_dict(s["model"])
    trainer.optim.load_state_dict(s["optim"])
    trainer.sched.load_state_dict(s["sched"])
    trainer.step = trainer.chunked_upto = step
    trainer.res.rows, trainer.res.attn_weights = s["rows"], s["attn_weights"]
    torch.set_rng_state(s["rng"]["torch"])
    random.setstate(s["rng"]["python"])
    if s["rng"]["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["rng"]["cuda"])
    return True


def chunk_path(ckpt_path: Path, step: int) -> Path:
    return Path(ckpt_path).parent / f"log-{step:08d}.pt"


def chunks(ckpt_path: Path, upto: int | None = None) -> list[Path]:
    """The chunks beside ckpt_path in step order (up to and including step `upto`)."""
    found = sorted(Path(ckpt_path).parent.glob("log-*.pt"))
    return [p for p in found if upto is None or int(p.stem[4:]) <= upto]


def remove_checkpoint(ckpt_path: Path):
    """A finished run leaves nothing to resume from: ckpt.pt, the previous one and the chunks go
    (a damaged file set aside stays, for a look)."""
    ckpt_path = Path(ckpt_path)
    for p in [ckpt_path, prev_path(ckpt_path), ckpt_path.with_name(ckpt_path.name + ".new"), *chunks(ckpt_path)]:
        p.unlink(missing_ok=True)
