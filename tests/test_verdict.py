"""Verdicts: reproduced only when the signature holds on the run and not on its control."""
import math
from pathlib import Path

import pytest

from experiments.judging.checks import signature
from experiments.judging.expressions import evaluate as expr
from experiments.judging.verdict import RunView, evaluate

LN = math.log(64)


def run(copy_curve, status="completed", steps=None, **final):
    rows = [{"step": s, "loss/copy": v} for s, v in copy_curve]
    ctx = {"ln_V": LN, "V": 64, "steps_done": steps or rows[-1]["step"] + 10, "log_every": 10}
    return RunView(status=status, rows=rows, final=final, context=ctx)


PLATEAU = [{"name": "plateau", "kind": "plateau", "metric": "loss/copy", "level": "0.9 * ln_V", "op": ">=", "value": 5}]


def test_plateau_ratio_reproduces_against_a_fast_control():
    slow = run([(s, 4.1 if s < 600 else 0.1) for s in range(0, 1000, 10)])
    fast = run([(s, 4.1 if s < 100 else 0.1) for s in range(0, 1000, 10)])
    v = evaluate(PLATEAU, slow, fast)
    assert v["reproduced"] and v["checks"][0]["measured"] == pytest.approx(6.0)
    assert v["checks"][0]["control"] == pytest.approx(1.0)  # the control against itself
    assert not evaluate(PLATEAU, fast, fast)["reproduced"]


def test_plateau_that_only_outlasts_a_short_budget_does_not_count():
    never_leaves = run([(s, 4.1) for s in range(0, 300, 10)], steps=300)
    control = run([(s, 4.1 if s < 100 else 0.1) for s in range(0, 300, 10)], steps=300)
    v = evaluate(PLATEAU, never_leaves, control)
    assert v["checks"][0]["measured"] == pytest.approx(3.0) and not v["reproduced"]


def test_signature_that_the_control_also_satisfies_is_broken():
    checks = [{"name": "low", "kind": "threshold", "metric": "loss/copy", "at": "final", "op": "<=", "value": 1.0}]
    a, b = run([(0, 4.0), (10, 0.5)], **{"loss/copy": 0.5}), run([(0, 4.0), (10, 0.2)], **{"loss/copy": 0.2})
    v = evaluate(checks, a, b)
    assert v["checks"][0]["passed"] and v["signature_broken"] and not v["reproduced"]


def test_report_only_checks_do_not_gate():
    checks = [{"name": "low", "kind": "threshold", "metric": "loss/copy", "at": "final", "op": "<=", "value": 1.0},
              {"name": "shown", "kind": "ratio", "metric": "loss/copy", "at": "first", "report_only": True}]
    v = evaluate(checks, run([(0, 4.0), (10, 0.5)]), run([(0, 2.0), (10, 3.0)]))
    assert v["reproduced"] and v["checks"][1]["measured"] == pytest.approx(2.0)


def test_status_check_reads_module_and_message():
    c = [{"name": "nan", "kind": "status", "value": "diverged", "module_contains": "softmax"}]
    r = RunView(status="diverged", nonfinite={"module": "blocks.0.attn.softmax[naive]"})
    assert evaluate(c, r, RunView(status="completed"))["reproduced"]
    r.nonfinite["module"] = "blocks.0.mlp"
    assert not evaluate(c, r, RunView(status="completed"))["reproduced"]


def test_no_checks_never_reproduce_and_bad_checks_are_rejected():
    assert not evaluate([], run([(0, 1.0)]), None)["reproduced"]
    with pytest.raises(ValueError, match="unknown kind"):
        signature({"expect": ["x"], "checks": {"x": {"kind": "vibes"}}})
    with pytest.raises(ValueError, match="no check named 'y'"):
        signature({"expect": ["y"], "checks": {"x": {"kind": "status", "value": "error"}}})
    assert expr("0.9 * ln_V", {"ln_V": LN}) == pytest.approx(0.9 * LN)


def test_checks_are_keyed_by_name_and_shown_by_label():
    exp = {"expect": ["b", "a"], "checks": {"a": {"kind": "status", "value": "completed"},
                                             "b": {"name": "shown", "kind": "threshold", "metric": "m", "value": 1}}}
    assert [c["name"] for c in signature(exp)] == ["shown", "a"]


@pytest.mark.parametrize("text,value", [
    ("0.9 * ln_V", 0.9 * LN), ("ln_V - 0.5", LN - 0.5), ("0.5 * sqrt(d_k)", 2.0), ("2 ** 3 / 4", 2.0),
    ("-log(V) + max(1, d_k, 2) - min(3, 1)", -math.log(64) + 16 - 1), (5, 5.0), ("1e-6", 1e-6)])
def test_expressions_are_arithmetic_over_the_named_constants(text, value):
    assert expr(text, {"ln_V": LN, "V": 64, "d_k": 16}) == pytest.approx(value)


@pytest.mark.parametrize("text", [
    "ln_v", "().__class__.__base__.__subclasses__()", "__import__('os')", "open('x')", "d_k[0]",
    "V if V else 1", "lambda: 1", "ln_V ; 1", "1 < 2", "'a'", "True"])
def test_anything_else_is_a_one_line_error_at_parse_time(text):
    """Not eval: the sandbox escape and a typo fail alike, before anything runs."""
    with pytest.raises(ValueError) as e:
        signature({"expect": ["c"], "checks": {"c": {"kind": "threshold", "metric": "m", "value": text}}})
    assert "\n" not in str(e.value) and "exp.checks.c.value" in str(e.value)


def test_no_check_name_carries_its_threshold():
    """The verdict renders each threshold from the config; a name holding one goes stale after
    `exp.checks.NAME.value=...` (issue 23)."""
    import glob

    import yaml

    from tests.conftest import ROOT
    stale = []
    for f in [ROOT / "conf" / "config.yaml", *sorted(glob.glob(str(ROOT / "conf" / "*" / "*.yaml")))]:
        for key, c in (((yaml.safe_load(open(f)) or {}).get("exp") or {}).get("checks") or {}).items():
            name = str(c.get("name", ""))
            numbers = [str(c[k]) for k in ("value", "level", "tol") if c.get("kind") != "status" and c.get(k) is not None
                       and any(ch.isdigit() for ch in str(c[k])) and str(c[k]) not in ("0", "1")]
            if any(op in name for op in ("<", ">")) or any(n in name for n in numbers):
                stale.append(f"{Path(f).parent.name}/{Path(f).stem}: {key}: {name}")
    assert not stale, stale


def test_the_verdict_line_shows_each_check_measured_against_the_threshold_from_the_config():
    from experiments.judging.verdict import verdict_line
    from experiments.records import RunRecord
    slow = run([(s, 4.1 if s < 600 else 0.1) for s in range(0, 1000, 10)])
    fast = run([(s, 4.1 if s < 100 else 0.1) for s in range(0, 1000, 10)])
    checks = [{**PLATEAU[0], "key": "plateau", "value": 30}]  # as after exp.checks.plateau.value=30
    rec = RunRecord(exp="no_scaling", status="completed", wall_s=1.0, verdict=evaluate(checks, slow, fast))
    line = verdict_line(rec, "DIR")
    assert line == (f"[no_scaling] reproduced: false | status completed | plateau=6 (>= 30; plateau: loss/copy >= "
                    f"{0.9 * LN:.3g}) FAIL | 1.0s | DIR")


def test_a_run_that_raised_says_so_never_not_measurable():
    """Issue 26's falsehood: a run that crashed before logging read 'not measurable on this data'."""
    from experiments.judging.verdict import verdict_line
    from experiments.records import RunRecord
    checks = [{"name": "copy task solved", "key": "copy_solved", "kind": "threshold", "metric": "loss/copy",
               "op": "<=", "value": 0.05}]
    crashed = RunView(status="error", error="OSError: [Errno 22] Invalid argument")
    v = evaluate(checks, crashed, None)
    assert not v["reproduced"] and not v["not_measurable"] and v["error"].startswith("OSError")
    rec = RunRecord(exp="baseline", status="error", error=crashed.error, verdict=v)
    line = verdict_line(rec, "DIR")
    assert "not measurable" not in line
    assert line == "[baseline] reproduced: false | status error | not judged: the run raised OSError: [Errno 22] Invalid argument | DIR"
