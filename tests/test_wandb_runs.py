"""The W&B run of a failure holds its verdict and final metrics on the first run, when its control
trains in between (issue 23: opening the control's run used to finish the failure's)."""
from tests.conftest import TINY
from tests.wandb_offline import read_run


def test_first_run_of_a_failure_with_a_control_keeps_its_wandb_run_open_for_the_verdict(compose_cfg, tmp_path):
    import wandb
    from experiments.training.runner import run_experiment
    args = [a for a in TINY if not a.startswith("logger=")] + ["+exp=no_scaling", "logger=wandb", "logger.mode=offline"]
    cfg = compose_cfg(args, results_dir=tmp_path)
    record = run_experiment(cfg, tmp_path / "run")  # no control cached: it trains in between
    wandb.teardown()
    run = read_run(tmp_path / "run")
    assert run["tags"] == ["no_scaling", "failure", "seed0"] and run["exit_code"] == 0
    s = run["summary"]
    assert s["status"] == "completed" and s["reproduced"] == record.verdict["reproduced"]
    assert [c["name"] for c in s["verdict"]["checks"]] == [c["name"] for c in record.verdict["checks"]]
    assert s["final/loss/copy"] == record.final["loss/copy"]
    (cdir,) = (tmp_path / "controls").iterdir()
    control = read_run(cdir)
    assert control["tags"] == ["baseline", "control", "seed0"] and control["group"] == "no_scaling"
    assert control["summary"]["status"] == "completed" and "final/loss/copy" in control["summary"]
