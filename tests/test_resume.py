"""Resume after a kill: rerunning the same command after SIGKILL (at any step, even mid-checkpoint
write) or SIGTERM, or with a damaged checkpoint, ends with metrics.csv and final metrics identical
to an uninterrupted run."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from conftest import ROOT, TINY
from experiments.io import load_attn_weights

# 24 steps, a checkpoint every 5; one torch thread so every process computes the same sums
ARGS = [*TINY, "train.steps=24", "train.ckpt_every=5", "train.log_every=1", "train.diag_every=4"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "PYTHONWARNINGS": "ignore"}

# Runs run.py in-process and SIGKILLs itself at a chosen point: a deterministic "kill at step K".
KILLER = """
import os, runpy, signal, sys
sys.path.insert(0, {root!r})
from experiments.training import checkpoint, loop as train
where, k = sys.argv[1], int(sys.argv[2])
if where in ("KILL", "TERM"):  # signalled during training step k
    orig = train.Trainer.train_step
    def train_step(self, *a, **kw):
        if self.step == k:
            os.kill(os.getpid(), getattr(signal, "SIG" + where))
        return orig(self, *a, **kw)
    train.Trainer.train_step = train_step
else:                        # killed halfway through writing the checkpoint of step k
    def write_verified(path, obj):
        if obj.get("step") == k:
            with open(str(path) + ".new", "wb") as f:
                f.write(b"half a checkpoint")
            os.kill(os.getpid(), signal.SIGKILL)
        checkpoint.__dict__["_orig_write"](path, obj)
    checkpoint._orig_write, checkpoint.write_verified = checkpoint.write_verified, write_verified
sys.argv = ["run.py", *sys.argv[3:]]
runpy.run_path({run!r}, run_name="__main__")
"""


def run_py(args, results):
    return subprocess.run([sys.executable, "run.py", *args, f"results_dir={results}"], cwd=ROOT,
                          env=ENV, capture_output=True, text=True, timeout=120)


def killed_run(where, k, args, results):
    code = KILLER.format(root=str(ROOT), run=str(ROOT / "run.py"))
    return subprocess.run([sys.executable, "-c", code, where, str(k), *args, f"results_dir={results}"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)


def run_dirs(results):
    return sorted((Path(results) / "runs" / "baseline").iterdir())


def completed(results):
    out = []
    for d in run_dirs(results):
        s = d / "summary.json"
        if s.exists() and json.loads(s.read_text())["status"] == "completed":
            out.append(d)
    return out


def checkpoints(results):
    return list((Path(results) / "checkpoints").glob("*/ckpt.pt"))


def ckpt_step(results):
    import torch
    [ckpt] = checkpoints(results)
    return torch.load(ckpt, weights_only=False)["step"]


def test_killed_and_preempted_run_resumes_bitwise_identical(tmp_path):
    ref, res = tmp_path / "ref", tmp_path / "killed"
    p = run_py(ARGS, ref)
    assert p.returncode == 0, p.stderr[-2000:]
    [ref_dir] = completed(ref)

    # SIGTERM during step 7: checkpoint at the next step boundary, one line, exit 143
    p = killed_run("TERM", 7, ARGS, res)
    assert p.returncode == 143, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("preempted:") and "rerun" in lines[0], p.stderr
    assert ckpt_step(res) == 8 and not completed(res)
    # SIGKILL during step 13: resumed at 8; the checkpoint of 10 survives, 11..12 are lost
    assert killed_run("KILL", 13, ARGS, res).returncode == -signal.SIGKILL
    assert ckpt_step(res) == 10 and not completed(res)
    # SIGKILL halfway through writing the checkpoint of step 20: the one of 15 stays intact
    assert killed_run("ckpt", 20, ARGS, res).returncode == -signal.SIGKILL
    assert ckpt_step(res) == 15 and not completed(res)
    # ...and then ckpt.pt is truncated (a copy off a cluster, a full disk): the one of 10 is kept
    [ckpt] = checkpoints(res)
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    p = run_py(ARGS, res)                      # the same command: resumes at 10, finishes
    assert p.returncode == 0, p.stderr[-2000:]
    [line] = [x for x in p.stderr.splitlines() if x.startswith("checkpoint:")]
    assert str(ckpt) in line and "damaged" in line and "resuming from ckpt.prev.pt at step 10" in line, line
    assert (ckpt.parent / "ckpt.pt.damaged").stat().st_size == 1000  # set aside, kept
    [done] = completed(res)

    assert (done / "metrics.csv").read_bytes() == (ref_dir / "metrics.csv").read_bytes()
    wa, wb = (load_attn_weights(d / "attn_weights.npz") for d in (done, ref_dir))
    assert sorted(wa) == sorted(wb) == [0, 4, 8, 12, 16, 20, 23]
    assert all(np.array_equal(wa[s]["L0"], wb[s]["L0"]) for s in wa)
    a, b = (json.loads((d / "summary.json").read_text()) for d in (done, ref_dir))
    assert a["final"] == b["final"] and a["steps_done"] == b["steps_done"] == 24
    assert a["verdict"]["checks"] == b["verdict"]["checks"]
    assert not checkpoints(res)                # a finished run leaves no checkpoint to resume from
    assert not list((Path(res) / "checkpoints").glob("*/log-*.pt"))
    assert not list((Path(res) / "checkpoints").glob("*/ckpt.prev.pt"))
    assert len(run_dirs(res)) == 4             # the interrupted attempts recorded nothing as run


def test_damaged_checkpoint_is_set_aside_and_the_run_goes_on(compose_cfg, tmp_path, capsys):
    """A truncated ckpt.pt: resume from ckpt.prev.pt; a damaged log chunk under that too: restart
    from step 0. Each damaged file named in one line and kept; the rows end as if never broken."""
    import torch

    from experiments.training import checkpoint
    from experiments.training.loop import Trainer
    cfg = compose_cfg([*TINY, "train.steps=24", "train.ckpt_every=5", "train.log_every=1"], results_dir=tmp_path)
    ckpt = tmp_path / "ckpt" / "ckpt.pt"
    ref = Trainer(cfg, tmp_path / "run", ckpt_path=ckpt).run()  # leaves the checkpoints of 20 and 15
    assert torch.load(checkpoint.prev_path(ckpt), weights_only=False)["step"] == 15

    ckpt.write_bytes(ckpt.read_bytes()[:500])
    t = Trainer(cfg, tmp_path / "run", ckpt_path=ckpt)
    assert t.try_resume() and t.step == 15 and t.res.rows == [r for r in ref.rows if r["step"] < 15]
    [line] = capsys.readouterr().err.strip().splitlines()
    assert f"{ckpt} is damaged" in line and line.endswith("resuming from ckpt.prev.pt at step 15"), line
    assert (ckpt.parent / "ckpt.pt.damaged").stat().st_size == 500

    chunk = checkpoint.chunk_path(ckpt, 10)
    chunk.write_bytes(b"not a chunk")
    t = Trainer(cfg, tmp_path / "run", ckpt_path=ckpt)
    assert not t.try_resume() and t.step == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and f"{chunk} is damaged" in lines[0] and "log-00000010.pt.damaged" in lines[0]
    assert "ckpt.prev.pt is damaged" in lines[1] and "missing" in lines[1] and lines[1].endswith("restarting from step 0")
    assert not checkpoint.chunks(ckpt)  # a lost future's log is gone, not read twice
    assert t.run().rows == ref.rows
