"""run.py end to end on a tiny config, and every experiment config composes."""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY, run_py

EXPS = sorted(p.stem for p in (ROOT / "conf" / "exp").glob("*.yaml"))


def test_tiny_run_writes_metrics_summary_figure_and_offline_wandb(tmp_path):
    args = [a for a in TINY if not a.startswith("logger=")] + ["logger=wandb", f"results_dir={tmp_path}"]
    p = run_py(args, cwd=tmp_path, env={"WANDB_MODE": "offline"})
    assert p.returncode == 0, p.stderr[-2000:]
    (run_dir,) = (tmp_path / "runs" / "baseline").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["exp"] == "baseline"
    import torch
    assert summary["env"]["torch"] == torch.__version__
    # train.threads' default, auto, set at the start: OMP_NUM_THREADS (conftest's under xdist) wins over the reading
    assert summary["config"]["train"]["threads"] == "auto" and 1 <= summary["env"]["threads"] <= os.cpu_count()
    omp = os.environ.get("OMP_NUM_THREADS")
    assert summary["env"]["threads_why"] == (f"OMP_NUM_THREADS={omp}" if omp else summary["env"]["threads_why"])
    assert omp or summary["env"]["threads_why"].startswith("auto: ")
    assert set(summary["verdict"]) >= {"reproduced", "checks"}
    assert summary["verdict"]["checks"][0]["measured"] == summary["final"]["loss/copy"]
    rows = list(csv.DictReader(open(run_dir / "metrics.csv")))
    assert [int(r["step"]) for r in rows] == [0, 2, 3, 4, 5]  # log_every=2, diagnostics at 0, 3 and the end
    assert {"loss/train", "loss/copy", "loss/first_half", "lr", "grad/norm"} <= set(rows[0])
    assert rows[0]["attn/entropy/L0"] and rows[0]["grad/scores/L0"] and rows[0]["grad/W_q/L0"]
    assert rows[1]["attn/entropy/L0"] == ""  # off between diagnostic steps
    assert (run_dir / "curves.png").stat().st_size > 1000
    assert list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert "reproduced:" in p.stdout
    log = (run_dir / "run.log").read_text()  # what the run printed, from its command to its verdict line
    assert log.startswith("$ python run.py model.d_model=32 ") and p.stdout.splitlines()[-1] + "\n" in log
    from omegaconf import OmegaConf  # the run dir records exactly the config that trained (on text: test_on_text.py)
    assert OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml"), resolve=True) == summary["config"]


def test_experiment_with_control_trains_the_control_once_and_reuses_it(compose_cfg, tmp_path):
    """The control is cached by its config alone: another experiment whose control equals it (under
    another name) reuses it (issue 23); a completed run leaves no checkpoint dir holding a .lock."""
    from experiments.training.runner import run_experiment
    cfg = compose_cfg(TINY, results_dir=tmp_path)
    cfg["exp"].update(name="unscaled_tiny", claim="test", control={
        "name": "baseline", "overrides": {"model.attention.scale": "sqrt_dk"}}, expect=["std"],
        checks={"std": {"kind": "threshold", "metric": "attn/score_std/L0", "at": 0, "op": ">", "value": 0}})
    cfg["model"]["attention"]["scale"] = "none"
    s1 = run_experiment(cfg, tmp_path / "a")
    cfg["exp"].update(name="renamed", control={**cfg["exp"]["control"], "name": "healthy"})
    s2 = run_experiment(cfg, tmp_path / "b")
    assert s1.control["dir"] == s2.control["dir"] and s2.control["name"] == "healthy"
    (cdir,) = (tmp_path / "controls").iterdir()
    assert cdir.name == s1.control["config_hash"]
    assert not list(tmp_path.glob("checkpoints/*"))
    # the signature (score std > 0) also holds on the control: a broken signature, not a reproduction
    assert s1.verdict["signature_broken"] and not s1.verdict["reproduced"]
    ctrl = json.loads((Path(s1.control["dir"]) / "summary.json").read_text())
    assert ctrl["config"]["model"]["attention"]["scale"] == "sqrt_dk"
    # named for what it is (issue 35): the experiment's name for it, whose control it is, its config
    # hash, the experiment it was trained for; the verdict line says trained, or reused from where
    from experiments.judging.verdict import verdict_line
    assert {k: s1.control[k] for k in ("name", "of", "trained_for", "reused")} == {
        "name": "baseline", "of": "unscaled_tiny", "trained_for": "unscaled_tiny", "reused": False}
    assert {k: s2.control[k] for k in ("name", "of", "trained_for", "reused")} == {
        "name": "healthy", "of": "renamed", "trained_for": "unscaled_tiny", "reused": True}
    assert ctrl["trained_for"] == "unscaled_tiny" and s2.control["config_hash"] == cdir.name
    assert "| control: trained | " in verdict_line(s1, tmp_path / "a")
    assert f"| control: reused ({cdir}) | " in verdict_line(s2, tmp_path / "b")
    from experiments.report.figures import control_label
    assert control_label(s2.control) == f"healthy (control; config {cdir.name}, trained for unscaled_tiny)"


def test_a_control_named_after_an_experiment_is_that_experiments_config():
    """no_scaling's control was named `baseline` but is another model than `python run.py` trains
    (issue 35): a control that bears an experiment's name must train that experiment's config."""
    from experiments.config import compose
    from experiments.records import config_hash
    from experiments.training.runner import control_config
    named = {}
    for exp in EXPS:
        cfg = compose([f"+exp={exp}"])
        if cfg["exp"]["control"] and cfg["exp"]["control"].get("name") in EXPS:
            named[exp] = cfg["exp"]["control"]["name"]
            assert config_hash(control_config(cfg)) == config_hash(compose([f"+exp={named[exp]}"])), (exp, named[exp])
    assert named == {"cosine_no_temperature": "cosine_learned_temperature",  # each other's control: checked above
                     "cosine_learned_temperature": "cosine_no_temperature"}


@pytest.mark.parametrize("exp", EXPS)
def test_every_experiment_config_composes(compose_cfg, exp):
    cfg = compose_cfg([f"+exp={exp}"])
    assert cfg["exp"]["name"] == exp
    assert cfg["exp"].get("claim")
    from experiments.judging.checks import signature
    from experiments.schema import validate
    assert signature(cfg["exp"])
    validate(cfg)  # every shipped experiment passes the schema
    from experiments.training.measures import MEASURES
    assert set(cfg["exp"]["measures"]) <= set(MEASURES)  # named in the registry, not imported by string


def test_a_typo_in_a_check_exits_2_before_any_step(tmp_path):
    p = run_py([*TINY, "+exp=no_scaling", "exp.checks.plateau.level=0.9*ln_v", f"results_dir={tmp_path}"],
               cwd=tmp_path)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
    assert "exp.checks.plateau.level" in lines[0] and "'ln_v'" in lines[0]
    assert not list(tmp_path.rglob("metrics.csv"))  # nothing trained, the control neither


def test_one_threshold_is_overridden_by_its_name(compose_cfg):
    from experiments.judging.checks import signature
    cfg = compose_cfg(["+exp=additive_scores", "exp.checks.slower_per_step.value=9"])
    checks = {c["name"]: c for c in signature(cfg["exp"])}
    assert checks["slower per step"]["value"] == 9
    assert checks["same final copy loss"]["value"] == "0.1 * ln_V"  # shared, defined once in config.yaml
    assert cfg["exp"]["control"].get("measures") is None and cfg["exp"]["measures"]  # the control's: its exp's


def test_a_sweep_preset_without_m_exits_2_saying_what_to_run(tmp_path):
    p = run_py(["+exp=heads", f"results_dir={tmp_path}"], cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.startswith("error: heads is a sweep: python run.py -m +exp=heads")
    assert len(p.stderr.strip().splitlines()) == 1 and not list(tmp_path.rglob("summary.json"))


def test_the_report_package_loads_neither_torch_nor_wandb():
    code = ("import sys, experiments.report, experiments.report.sections.catalogue, experiments.report.sections.heads, "
            "experiments.report.sections.phase, experiments.report.sections.bench, experiments.report.sections.disk, "
            "experiments.report.seeds, experiments.records; "
            "print(sorted(m for m in ('torch', 'wandb') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stderr[-2000:] + p.stdout



def test_train_threads_sets_torchs_threads_for_the_run_and_summary_records_them(compose_cfg, tmp_path):
    import torch

    from experiments.training.runner import run_experiment
    before = torch.get_num_threads()
    try:
        for n in (2, 1):
            rec = run_experiment(compose_cfg([*TINY, f"train.threads={n}"], results_dir=tmp_path), tmp_path / str(n))
            assert torch.get_num_threads() == n and rec.env["threads"] == n
            assert json.loads((tmp_path / str(n) / "summary.json").read_text())["env"]["threads"] == n
        torch.set_num_threads(3)
        rec = run_experiment(compose_cfg([*TINY, "train.threads=null"], results_dir=tmp_path), tmp_path / "null")
        assert rec.env["threads"] == 3  # null: as torch (or the launcher) set them
        # not hashed: one control, whatever the threads (and every hash from before the key, kept)
        from experiments.records import config_hash
        a, b = (compose_cfg([*TINY, f"train.threads={n}"]) for n in (1, 2))
        assert config_hash(a) == config_hash(b)
    finally:
        torch.set_num_threads(before)
