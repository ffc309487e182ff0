"""A job that raised is never `completed` (issue 23): its summary.json says status error with the
message, its W&B run too, the traceback is kept in the run dir, and a multirun exits non-zero."""
import json
import subprocess
import sys

from tests.conftest import ROOT, TINY
from tests.wandb_offline import read_run


def test_a_crash_after_training_is_status_error_with_its_traceback_and_the_multirun_exits_1(tmp_path):
    # the control's measure raises (os.path.join(trainer, cfg): TypeError) after the failure trained
    args = ["-m", *[a for a in TINY if not a.startswith("logger=")],
            "+exp=no_scaling", "seed=0", '+exp.control.measures=["os.path:join"]', f"results_dir={tmp_path}"]
    p = subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env={**__import__("os").environ, "WANDB_MODE": "offline"})
    assert p.returncode == 1, p.stderr[-3000:]
    (job,) = (tmp_path / "multirun").glob("*/0_no_scaling_seed0")
    s = json.loads((job / "summary.json").read_text())
    assert s["status"] == "error" and s["error"].startswith("TypeError: expected str"), s["error"]
    tb = (job / "traceback.txt").read_text()
    assert tb.startswith("Traceback") and "find_or_train_control" in tb and "TypeError" in tb
    assert f"error: [no_scaling] {s['error']} (traceback: {job / 'traceback.txt'})" in p.stderr
    assert "crashed: 0_no_scaling_seed0: status error" in p.stderr
    run = read_run(job)  # the failure's W&B run says so too, and was closed as failed
    assert run["summary"]["status"] == "error" and run["summary"]["error"] == s["error"] and run["exit_code"] == 1
