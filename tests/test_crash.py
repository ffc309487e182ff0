"""A job that raised is never `completed` (issue 23): its summary.json says status error with the
message, its W&B run too, the traceback is kept in the run dir, and a multirun exits non-zero."""
import json
import subprocess
import sys

from tests.conftest import ROOT, TINY
from tests.wandb_offline import read_run


def test_a_crash_after_training_is_status_error_with_its_traceback_and_the_multirun_exits_1(tmp_path):
    # the control's measure raises after the failure trained (fact_weights reads two_facts' fact
    # positions, which the copy task has not: AttributeError)
    args = ["-m", *[a for a in TINY if not a.startswith("logger=")],
            "+exp=no_scaling", "seed=0", '+exp.control.measures=["fact_weights"]', f"results_dir={tmp_path}"]
    p = subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env={**__import__("os").environ, "WANDB_MODE": "offline"})
    assert p.returncode == 1, p.stderr[-3000:]
    (job,) = (tmp_path / "multirun").glob("*/0_no_scaling_seed0")
    s = json.loads((job / "summary.json").read_text())
    assert s["status"] == "error" and s["error"].startswith("AttributeError: "), s["error"]
    tb = (job / "traceback.txt").read_text()
    assert tb.startswith("Traceback") and "find_or_train_control" in tb and "AttributeError" in tb
    assert f"error: [no_scaling] {s['error']} (traceback: {job / 'traceback.txt'})" in p.stderr
    assert f"error: [no_scaling] {s['error']} (traceback: {job / 'traceback.txt'})" in (job / "run.log").read_text()
    assert "crashed: 0_no_scaling_seed0: status error" in p.stderr
    run = read_run(job)  # the failure's W&B run says so too, and was closed as failed
    assert run["summary"]["status"] == "error" and run["summary"]["error"] == s["error"] and run["exit_code"] == 1


def test_only_the_error_an_experiment_expects_exits_0_in_the_runner_and_the_rejudge(tmp_path, monkeypatch):
    """mask_broadcast_shape_error expects the shape error: that one is a result (exit 0); any other
    crash of the same experiment is not (issue 35), whether judged by the runner or judged again."""
    import run
    from experiments.config import compose
    from experiments.rejudge import main as judge_again
    from experiments.training import loop
    from experiments.training.runner import run_experiment
    cfg = compose([*TINY, "+exp=mask_broadcast_shape_error", "data.max_len=7"])
    cfg["results_dir"] = str(tmp_path)
    expected = run_experiment(cfg, tmp_path / "expected")
    assert expected.status == "error" and "must match the size of tensor" in expected.error
    assert expected.expected_error and expected.verdict["reproduced"] and run.exit_code(expected) == 0
    train = loop.Trainer.run

    def crash(self):
        if self.cfg["exp"]["name"] == "mask_broadcast_shape_error":  # the failure; its control trains
            raise RuntimeError("boom: not the shape error")
        return train(self)
    monkeypatch.setattr(loop.Trainer, "run", crash)
    other = run_experiment(cfg, tmp_path / "other")
    assert other.status == "error" and other.error == "RuntimeError: boom: not the shape error"
    assert other.expected_error is False and not other.verdict["reproduced"] and run.exit_code(other) == 1
    assert judge_again([str(tmp_path / "other"), str(tmp_path / "expected")]) == 0
    s = {d: json.loads((tmp_path / d / "summary.json").read_text()) for d in ("other", "expected")}
    assert s["other"]["expected_error"] is False and s["expected"]["expected_error"] is True
