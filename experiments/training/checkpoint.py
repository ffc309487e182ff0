"""Checkpoints: everything a killed run needs to continue as if never stopped (model, optimizer,
scheduler, step, every RNG state), written atomically.

ckpt.pt holds what resuming needs and is the same size at every step. What grows with the step
count (the logged rows, the recorded attention weights) goes beside it, one chunk per checkpoint
holding only what was logged since the previous one: nothing is rewritten.
"""
import random
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
    save_torch(chunk_path(trainer.ckpt_path, trainer.step), {"rows": rows, "attn_weights": weights})
    save_torch(trainer.ckpt_path, state(trainer))
    trainer.chunked_upto = trainer.step


def resume(trainer) -> bool:
    """Load trainer.ckpt_path (and the chunks up to it) into the trainer if it exists; True if it did."""
    if trainer.ckpt_path is None or not trainer.ckpt_path.exists():
        return False
    s = torch.load(trainer.ckpt_path, map_location=trainer.device, weights_only=False)
    trainer.model.load_state_dict(s["model"])
    trainer.optim.load_state_dict(s["optim"])
    trainer.sched.load_state_dict(s["sched"])
    trainer.step = trainer.chunked_upto = s["step"]
    trainer.res.rows, trainer.res.attn_weights = [], {}
    for p in chunks(trainer.ckpt_path, upto=trainer.step):
        c = torch.load(p, weights_only=False)
        trainer.res.rows += c["rows"]
        trainer.res.attn_weights.update(c["attn_weights"])
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
    """A finished run leaves nothing to resume from: ckpt.pt and its chunks go."""
    for p in [Path(ckpt_path), *chunks(ckpt_path)]:
        p.unlink(missing_ok=True)
