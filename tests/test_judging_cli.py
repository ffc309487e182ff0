"""`python -m experiments.rejudge DIR... exp.checks.NAME.FIELD=VALUE`: existing runs judged again
under changed thresholds, without training (issue 23)."""
import json
import math

from experiments.io import write_json, write_rows_csv
from experiments.records import RunRecord
from experiments.rejudge import main

LN = math.log(64)
EXP = {"name": "slow", "control": {"name": "fast", "overrides": {}}, "expect": ["plateau"], "floor": None,
       "checks": {"plateau": {"name": "plateau vs the control's", "kind": "plateau", "metric": "loss/copy",
                              "level": "0.9 * ln_V", "op": ">=", "value": 5}}}


def run_dir(d, exp, leaves_at, **kw):
    rows = [{"step": s, "loss/copy": 4.1 if s < leaves_at else 0.1} for s in range(0, 1000, 10)]
    write_rows_csv(d / "metrics.csv", rows)
    ctx = {"ln_V": LN, "V": 64, "steps_done": 1000, "log_every": 10}
    rec = RunRecord(exp=exp, status="completed", context=ctx, config={"exp": EXP}, **kw)
    write_json(d / "summary.json", rec.to_summary())


def test_a_run_is_judged_again_under_a_new_threshold(tmp_path, capsys):
    run_dir(tmp_path / "controls" / "c", "fast", 100, role="control")
    run_dir(tmp_path / "runs" / "slow" / "t", "slow", 600, role="failure", verdict={"reproduced": True, "checks": []},
            control={"name": "fast", "dir": str(tmp_path / "controls" / "c")})
    assert main([str(tmp_path / "runs"), "exp.checks.plateau.value=30"]) == 0
    out = capsys.readouterr().out
    assert "[slow] reproduced: false | status completed | plateau=6 (>= 30; plateau: loss/copy >= 3.74) FAIL" in out
    s = json.loads((tmp_path / "runs" / "slow" / "t" / "summary.json").read_text())
    assert s["verdict"]["reproduced"] is False and s["verdict"]["checks"][0]["threshold"] == 30
    assert s["config"]["exp"]["checks"]["plateau"]["value"] == 30  # the summary says what it was judged by
    assert main([str(tmp_path / "runs"), "exp.checks.plateau.value=5"]) == 0
    assert json.loads((tmp_path / "runs" / "slow" / "t" / "summary.json").read_text())["verdict"]["reproduced"]


def test_bad_input_is_one_line_and_exit_2_and_nothing_is_rewritten(tmp_path, capsys):
    run_dir(tmp_path / "r", "slow", 600, role="baseline", verdict={"reproduced": True, "checks": []})
    before = (tmp_path / "r" / "summary.json").read_text()
    for args, msg in (([str(tmp_path), "exp.checks.platau.value=3"], "no run here has this check (did you mean plateau?)"),
                      ([str(tmp_path), "exp.checks.plateau.valu=3"], "'valu' is not a check field (did you mean value?)"),
                      ([str(tmp_path), "exp.checks.plateau.level=ln_v"], "unknown name 'ln_v'"),
                      ([str(tmp_path), "train.steps=3"], "only thresholds can be judged again without training")):
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0], err
    assert (tmp_path / "r" / "summary.json").read_text() == before


def test_judging_again_redraws_the_figure_with_the_new_verdict(tmp_path, capsys):
    """curves.png's verdict panel says what summary.json says after a re-judge (issue 35): the
    figure is drawn again from the run's files, byte for byte as a fresh draw of them."""
    from conftest import TINY
    from experiments.config import compose
    from experiments.layout import CURVES
    from experiments.report.figures import draw_curves
    from experiments.training.runner import run_experiment
    cfg = compose([*TINY, "+exp=no_scaling"])
    cfg["results_dir"] = str(tmp_path)
    d = tmp_path / "runs" / "no_scaling" / "t"
    draw_curves(run_experiment(cfg, d), d / CURVES)  # as run.py leaves it
    before = (d / CURVES).read_bytes()
    assert main([str(d), "exp.checks.saturated_rows.value=2"]) == 0  # a share of rows can never reach 2
    assert "saturated_rows=" in capsys.readouterr().out
    after = RunRecord.read(d)
    assert not after.verdict["reproduced"] and not next(c for c in after.verdict["checks"]
                                                         if c["key"] == "saturated_rows")["passed"]
    draw_curves(after, tmp_path / "fresh.png")
    assert (d / CURVES).read_bytes() == (tmp_path / "fresh.png").read_bytes() != before
