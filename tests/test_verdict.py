"""Verdicts: reproduced only when the signature holds on the run and not on its control."""
import math

import pytest

from experiments.verdict import RunView, evaluate, expr, validate_checks

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
        validate_checks([{"name": "x", "kind": "vibes"}])
    assert expr("0.9 * ln_V", {"ln_V": LN}) == pytest.approx(0.9 * LN)
