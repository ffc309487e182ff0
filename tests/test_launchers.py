"""Multiruns through the joblib and submitit launchers (tiny configs), submitit's requeue path
after a preemption signal, and the catalogue glob leaving sweep presets out."""
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import ROOT, TINY

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "PYTHONWARNINGS": "ignore"}


def multirun(tmp_path, *args, timeout=300):
    return subprocess.run([sys.executable, "run.py", "-m", *TINY, f"results_dir={tmp_path}", *args],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


def job_summaries(sweep: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(sweep.glob("*/summary.json"))]


@pytest.mark.parametrize("launcher,seeds", [(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], [0, 1]),
                                            # submitit_local starts a process per job: two (of four) say as much, for half the CPU
                                            (["hydra/launcher=submitit_local"], [0])], ids=["joblib", "submitit_local"])
def test_multirun_jobs_and_a_report(launcher, seeds, tmp_path):
    exp = "no_scaling"  # a failure with a control, next to the baseline (the acceptance)
    p = multirun(tmp_path, f"+exp=baseline,{exp}", "seed=" + ",".join(map(str, seeds)), *launcher)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    [sweep] = (tmp_path / "multirun").iterdir()
    runs = job_summaries(sweep)
    assert len(runs) == 2 * len(seeds) and all(s["status"] in ("completed", "diverged") for s in runs)
    assert sorted(s["seed"] for s in runs) == sorted(seeds * 2)
    assert sum(s["exp"] == "baseline" for s in runs) == len(seeds)
    for d in sorted(p for p in sweep.iterdir() if (p / "summary.json").exists()):
        assert (d / "metrics.csv").stat().st_size > 0
    assert (sweep / "REPORT.md").exists(), p.stdout[-2000:]
    assert "report:" in p.stdout


def _submitit_task(marker: str) -> int | None:
    """The pid of the submitit task (not its controller) started with our marker in its env."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"TEST_MARK={marker}".encode() in env and any(e.startswith(b"SUBMITIT_LOCAL_GLOBALID=") for e in env):
            return int(d.name)
    return None


def test_submitit_requeue_after_preemption_resumes_identically(tmp_path):
    # long enough to be running when the signal lands after the first checkpoint (about 5 ms a step)
    args = ["train.steps=600", "train.ckpt_every=50", "train.log_every=25", "train.diag_every=0"]
    ref = subprocess.run([sys.executable, "run.py", *TINY, *args, f"results_dir={tmp_path / 'ref'}"],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr[-2000:]
    [ref_dir] = (tmp_path / "ref" / "runs" / "baseline").iterdir()

    marker = uuid.uuid4().hex
    res = tmp_path / "sub"
    p = subprocess.Popen([sys.executable, "run.py", "-m", *TINY, *args, f"results_dir={res}",
                          "hydra/launcher=submitit_local"], cwd=ROOT, env={**ENV, "TEST_MARK": marker},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, pid = time.time() + 120, None
        while time.time() < deadline and not list(res.glob("checkpoints/*/ckpt.pt")):
            time.sleep(0.05)
        pid = _submitit_task(marker)
        assert pid, "no submitit task found"
        os.kill(pid, signal.SIGUSR2)  # what SLURM sends (via submitit) on preemption or time-out
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, out[-2000:] + err[-2000:]
    [sweep] = (res / "multirun").iterdir()
    log = "".join(f.read_text() for f in sweep.glob(".submitit/*/*_log.*"))
    assert "Requeued job" in log, log[-3000:]
    [job] = [d for d in sweep.iterdir() if (d / "summary.json").exists()]
    assert (job / "metrics.csv").read_bytes() == (ref_dir / "metrics.csv").read_bytes()
    a, b = (json.loads((d / "summary.json").read_text()) for d in (job, ref_dir))
    assert a["final"] == b["final"] and a["status"] == "completed"


def test_catalogue_glob_leaves_sweep_presets_out():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from experiments.command_line import exclude_sweep_presets, sweep_presets
    conf = ROOT / "conf"
    presets = sweep_presets(conf)
    assert "phase_no_scaling" in presets and "baseline" not in presets
    [arg] = exclude_sweep_presets(["+exp=glob(*)"], conf)
    names = sorted(p.stem for p in (conf / "exp").glob("*.yaml"))
    chosen = OverridesParser.create().parse_overrides([arg])[0].value().filter(names)
    assert "baseline" in chosen and not set(chosen) & set(presets)
    assert sorted(chosen) == sorted(set(names) - set(presets))
    # a user's own exclude is left alone, and other overrides pass through
    assert exclude_sweep_presets(["exp=glob(*,exclude=base*)", "seed=1"], conf) == \
        ["exp=glob(*,exclude=base*)", "seed=1"]
