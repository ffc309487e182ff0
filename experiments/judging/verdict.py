"""Judge a run by its signature (judging.checks): measure every check on the run and on its
control.

reproduced = every check holds on the failure run AND the signature as a whole does not hold
on the control. A signature the control also satisfies is broken, and says so.
A check whose metric neither the run nor its reference ever logged (loss/copy on text) is "not
measurable on this data": shown, never gated, never a FAIL (`not_measurable` lists them).
A check compared with "the control" evaluates the control against itself on the control side,
so ratio and plateau checks give 1 there and deltas 0.
A run that raised where its signature expects none is not reproduced and says so (`error`); its
checks are never "not measurable on this data" (nothing was measured because the run failed). A
control that raised voids the comparison (`control_error`): not reproduced either.
"""
import math
import operator
from dataclasses import dataclass, field

from experiments.judging.expressions import evaluate as expr

OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt}


@dataclass
class RunView:
    """What a check may read of one run."""
    status: str
    rows: list = field(default_factory=list)       # metrics.csv rows
    final: dict = field(default_factory=dict)
    nonfinite: dict | None = None
    error: str | None = None
    context: dict = field(default_factory=dict)   # names for expressions: ln_V, V, d_k, steps

    @classmethod
    def of(cls, run, rows: list) -> "RunView":
        """A RunRecord with its metrics rows; a run that did not complete has no final metrics."""
        return cls(status=run.status, rows=rows, final=run.final if run.status == "completed" else {},
                   nonfinite=run.nonfinite, error=run.error, context=run.context)

    def logged(self, metric) -> bool:
        return metric in self.final or any(r.get(metric) is not None for r in self.rows)

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


def with_gain(context: dict, floor: dict | None) -> dict:
    """context with `gain`: the floor's final loss minus its text model's (summary.json's
    floor.text_model), where both completed; unchanged otherwise (a check that reads it then says so)."""
    model = (floor or {}).get("text_model") or {}
    if (floor or {}).get("status") != "completed" or model.get("status") != "completed":
        return context
    return {**context, "gain": floor["final"]["loss/train"] - model["final"]["loss/train"]}


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
        min_steps = run.context.get("log_every", 1)  # a control that leaves at once still took a log interval
        return mine / max(theirs, min_steps)
    a, b = run.value(metric, at), ref.value(metric, c.get("control_at", at))
    if a is None or b is None:
        return None
    if kind == "ratio":
        return a / b if b else math.inf
    return a - b  # delta


def check(c: dict, run: RunView, ref: RunView) -> dict:
    """One check measured on `run`: its measured value, the threshold it is held to (op and
    threshold as numbers, evaluated from the config for this run; `expected` as text) and whether
    it passed."""
    measured = _measure(c, run, ref)
    op, target = None, None
    if c["kind"] == "status":
        passed = measured == c["value"]
        if passed and c.get("message_contains"):
            passed = c["message_contains"] in (run.error or "")
        if passed and c.get("module_contains"):
            passed = c["module_contains"] in ((run.nonfinite or {}).get("module") or "")
        op, target = "==", c["value"]
        expected = f"== {c['value']}"
    elif c["kind"] == "near":
        op, target = "<=", expr(c["tol"], run.context)
        passed = measured is not None and measured <= target
        expected = f"rel. error to {c['ref']} <= {target:g}"
    elif c.get("value") is not None:
        op, target = c.get("op", ">="), expr(c["value"], run.context)
        passed = measured is not None and math.isfinite(measured) and OPS[op](measured, target)
        expected = f"{op} {target:g}"
    else:  # report_only without a threshold: a measurement, not a claim
        passed, expected = measured is not None, "reported"
    out = {"name": c.get("name", c["kind"]), "key": c.get("key", c.get("name", c["kind"])), "kind": c["kind"],
           "metric": c.get("metric"), "passed": bool(passed), "measured": measured, "expected": expected,
           "op": op, "threshold": target}
    if c["kind"] == "plateau":  # the level that defines the plateau is a threshold too
        out["level"] = expr(c["level"], run.context)
    if isinstance(c.get("value"), str) and c["kind"] != "status":  # a threshold as written (`0.5 * gain`)
        out["rule"] = c["value"]
    return out


def measurable(c: dict, run: RunView, ref: RunView) -> bool:
    """False when the task never produces what the check reads (neither the run nor its reference
    logged the metric): a signature written for another task, not a failed check."""
    metrics = [m for m in (c.get("metric"), c.get("ref")) if m] if c["kind"] != "status" else []
    return all(run.logged(m) or ref.logged(m) for m in metrics)


def evaluate(expect: list[dict], run: RunView, control: RunView | None) -> dict:
    """expect: judging.checks.signature(spec), spec a config's `exp` node."""
    expect = list(expect)
    ok = [measurable(c, run, control or run) for c in expect]
    gates = [not c.get("report_only", False) and m for c, m in zip(expect, ok)]
    run_checks = [check(c, run, control or run) for c in expect]
    errored = run.status == "error" and not any(c["kind"] == "status" and c["value"] == "error" for c in expect)
    for rc, gate, m in zip(run_checks, gates, ok):
        rc["report_only"] = not gate
        if not m and not errored:  # a run that crashed measured nothing: that is no property of the data
            rc.update(passed=False, not_measurable=True, expected="not measurable on this data")
    signature = [rc["passed"] for rc, gate in zip(run_checks, gates) if gate]
    out = {"reproduced": bool(signature) and all(signature) and not errored, "checks": run_checks,
           "not_measurable": [rc["name"] for rc in run_checks if rc.get("not_measurable")]}
    if errored:
        out["error"] = run.error or "the run raised"
    if control is not None:
        ctrl_checks = [check(c, control, control) for c in expect]
        for rc, cc in zip(run_checks, ctrl_checks):
            rc["control"], rc["control_passed"] = cc["measured"], cc["passed"]
        out["signature_broken"] = all(cc["passed"] for cc, gate in zip(ctrl_checks, gates) if gate)
        out["reproduced"] = out["reproduced"] and not out["signature_broken"]
        out["control_status"] = control.status
        if control.status == "error":
            out["control_error"] = control.error or "the control raised"
            out["reproduced"] = False
    return out


def expected_error(status: str, verdict: dict | None) -> bool:
    """Whether a run that raised raised what its experiment expects: a status == error check of
    its signature held on it (with its message_contains, the very error). Any other crash of the
    same experiment is unexpected: its exit code is non-zero. The runner and the re-judge both
    set RunRecord.expected_error from here."""
    return status == "error" and any(c["kind"] == "status" and c["threshold"] == "error" and c["passed"]
                                     for c in (verdict or {}).get("checks", []))


def _num(x) -> str:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return "–" if x is None else str(x)
    return f"{x:.3g}" if math.isfinite(x) else str(x)


def check_text(c: dict) -> str:
    """One check as the verdict line shows it: its key (what `exp.checks.KEY.value=...` sets), the
    measured value, the threshold it was held to, and the outcome."""
    if c.get("not_measurable"):
        return f"{c['key']}: not measurable on this data"
    held = "" if c.get("op") is None else f" ({c['op']} {_num(c['threshold'])}" + (
        f"; plateau: {c['metric']} >= {_num(c['level'])}" if c.get("level") is not None else "") + ")"
    outcome = "reported" if c.get("report_only") else "ok" if c["passed"] else "FAIL"
    return f"{c.get('key', c['name'])}={_num(c['measured'])}{held} {outcome}"


def provenance(ref: dict) -> str:
    """A control's (or floor's) origin as the verdict line says it: `trained` (by this run), or
    `reused (its dir)`, from the cache of controls."""
    return f"reused ({ref['dir']})" if ref["reused"] else "trained"


def verdict_line(record, run_dir) -> str:
    """`[exp] reproduced: ... | status ... | each check | control: trained or reused (DIR) | time |
    run dir`; a run or a control that raised says so in place of the checks."""
    v = record.verdict or {}
    broken = " (signature also holds on the control: broken)" if v.get("signature_broken") else ""
    if record.status == "error" and not record.expected_error:
        checks = f"not judged: the run raised {record.error or v.get('error')}"
    elif v.get("control_error"):
        checks = f"not judged: the control raised {v['control_error']}"
    else:
        checks = ", ".join(check_text(c) for c in v.get("checks", []))
    refs = "".join(f"{role}: {provenance(ref)} | " for role, ref in (
        ("control", record.control), ("floor", record.floor), ("text model", (record.floor or {}).get("text_model")))
        if ref and "reused" in ref)
    wall = f"{record.wall_s:.1f}s | " if record.wall_s is not None else ""
    return (f"[{record.exp}] reproduced: {str(bool(v.get('reproduced'))).lower()}{broken} | "
            f"status {record.status} | {checks} | {refs}{wall}{run_dir}")
