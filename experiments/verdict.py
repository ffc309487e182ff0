"""Evaluate an experiment's declared signature (`exp.expect`) on its run and on its control.

reproduced = every check holds on the failure run AND the signature as a whole does not hold
on the control. A signature the control also satisfies is broken, and says so.

Check kinds (fields beyond name/kind/metric):
  threshold  value(metric, at) OP value
  ratio      value(metric, at) on the run / the same on the control  OP value
  delta      value on the run - value on the control  OP value
  near       |value(metric) - value(ref)| / |value(ref)| <= tol   (measured against a prediction)
  plateau    steps with `metric` >= level before it first drops below, run / control  OP value
  status     run status == value; optional message_contains / module_contains
Values and levels may be expressions over: ln_V (chance loss), V, d_k, steps, log, sqrt.
`at`: final (eval at the end; the last row when diverged) | first | last | min | max | a step.
A check with `report_only: true` is measured and shown (on the run and the control) but is not
part of the signature: for numbers the lesson makes claims about that the data may contradict.
A check compared with "the control" evaluates the control against itself on the control side,
so ratio and plateau checks give 1 there and deltas 0.
"""
import math
import operator
from dataclasses import dataclass, field

OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt}
KINDS = ("threshold", "ratio", "delta", "near", "plateau", "status")


@dataclass
class RunView:
    """What a check may read of one run."""
    status: str
    rows: list = field(default_factory=list)
    final: dict = field(default_factory=dict)
    nonfinite: dict | None = None
    error: str | None = None
    context: dict = field(default_factory=dict)   # names for expressions: ln_V, V, d_k, steps

    def series(self, metric):
        return [(r["step"], r[metric]) for r in self.rows if r.get(metric) is not None]

    def value(self, metric: str, at="final"):
        if at == "final" and metric in self.final:
            return self.final[metric]
        s = self.series(metric)
        if not s:
            return None
        if at in ("final", "last"):
            return s[-1][1]
        if at == "first":
            return s[0][1]
        if at == "min":
            return min(v for _, v in s)
        if at == "max":
            return max(v for _, v in s)
        return next((v for st, v in s if st == int(at)), None)

    def plateau_steps(self, metric: str, level: float) -> float:
        """Steps before `metric` first drops below `level` (the whole run if it never does)."""
        for step, v in self.series(metric):
            if v < level:
                return step
        return self.context.get("steps_done", self.context.get("steps", 0))


def expr(x, ctx: dict) -> float:
    if isinstance(x, (int, float)):
        return float(x)
    names = {"log": math.log, "sqrt": math.sqrt, **ctx}
    return float(eval(str(x), {"__builtins__": {}}, names))  # config-authored arithmetic only


def validate_checks(expect) -> None:
    for c in expect or []:
        if c.get("kind") not in KINDS:
            raise ValueError(f"exp.expect: check {c.get('name')!r} has unknown kind "
                             f"{c.get('kind')!r} (one of {', '.join(KINDS)})")
        if c["kind"] != "status" and c.get("op", ">=") not in OPS:
            raise ValueError(f"exp.expect: check {c.get('name')!r} has unknown op {c.get('op')!r}")


def _measure(c: dict, run: RunView, ref: RunView):
    """The measured number (or status) of check c on `run`, compared with `ref` where needed."""
    kind, metric, at = c["kind"], c.get("metric"), c.get("at", "final")
    if kind == "status":
        return run.status
    if kind == "threshold":
        return run.value(metric, at)
    if kind == "near":
        v, p = run.value(metric, at), run.value(c["ref"], at)
        return None if v is None or p in (None, 0) else abs(v - p) / abs(p)
    if kind == "plateau":
        level = expr(c["level"], run.context)
        mine, theirs = run.plateau_steps(metric, level), ref.plateau_steps(metric, level)
        floor = run.context.get("log_every", 1)  # a control that leaves at once still took a log interval
        return mine / max(theirs, floor)
    a, b = run.value(metric, at), ref.value(metric, c.get("control_at", at))
    if a is None or b is None:
        return None
    if kind == "ratio":
        return a / b if b else math.inf
    return a - b  # delta


def check(c: dict, run: RunView, ref: RunView) -> dict:
    measured = _measure(c, run, ref)
    if c["kind"] == "status":
        passed = measured == c["value"]
        if passed and c.get("message_contains"):
            passed = c["message_contains"] in (run.error or "")
        if passed and c.get("module_contains"):
            passed = c["module_contains"] in ((run.nonfinite or {}).get("module") or "")
        expected = f"== {c['value']}"
    elif c["kind"] == "near":
        tol = expr(c["tol"], run.context)
        passed = measured is not None and measured <= tol
        expected = f"rel. error to {c['ref']} <= {tol:g}"
    elif "value" in c:
        target = expr(c["value"], run.context)
        passed = measured is not None and math.isfinite(measured) and OPS[c.get("op", ">=")](measured, target)
        expected = f"{c.get('op', '>=')} {target:g}"
    else:  # report_only without a threshold: a measurement, not a claim
        passed, expected = measured is not None, "reported"
    return {"name": c.get("name", c["kind"]), "kind": c["kind"], "metric": c.get("metric"),
            "passed": bool(passed), "measured": measured, "expected": expected}


def evaluate(expect: list, run: RunView, control: RunView | None) -> dict:
    expect = list(expect or [])
    gates = [not c.get("report_only", False) for c in expect]
    run_checks = [check(c, run, control or run) for c in expect]
    for rc, gate in zip(run_checks, gates):
        rc["report_only"] = not gate
    signature = [rc["passed"] for rc, gate in zip(run_checks, gates) if gate]
    out = {"reproduced": bool(signature) and all(signature), "checks": run_checks}
    if control is not None:
        ctrl_checks = [check(c, control, control) for c in expect]
        for rc, cc in zip(run_checks, ctrl_checks):
            rc["control"], rc["control_passed"] = cc["measured"], cc["passed"]
        out["signature_broken"] = all(cc["passed"] for cc, gate in zip(ctrl_checks, gates) if gate)
        out["reproduced"] = out["reproduced"] and not out["signature_broken"]
        out["control_status"] = control.status
    return out
