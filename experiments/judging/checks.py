"""An experiment's signature, read from its config: `exp.expect` lists check names, `exp.checks`
defines every check by name (conf/config.yaml defines the shared ones once). `signature(exp)`
returns the checks in order, every field and expression parsed, or raises ValueError of one
line: preflight calls it, so a typo stops the run before any step.

Check kinds (fields beyond name/kind/metric; judging.verdict measures them):
  threshold  value(metric, at) OP value
  ratio      value(metric, at) on the run / the same on the control  OP value
  delta      value on the run - value on the control  OP value
  near       |value(metric) - value(ref)| / |value(ref)| <= tol   (measured against a prediction)
  plateau    steps with `metric` >= level before it first drops below, run / control  OP value
  status     run status == value; optional message_contains / module_contains
`value`, `level` and `tol` may be expressions (judging.expressions). `at`: final (eval at the end;
the last row when diverged) | first | last | min | max | a step; `op` is >= unless given.
A check with `report_only: true` is measured and shown but is not part of the signature.
"""
from experiments.judging.expressions import parse
from experiments.suggest import did_you_mean

OPS = ("<=", "<", ">=", ">")
KINDS = ("threshold", "ratio", "delta", "near", "plateau", "status")
NEEDS = {"threshold": ("metric",), "ratio": ("metric",), "delta": ("metric",),
         "near": ("metric", "ref", "tol"), "plateau": ("metric", "level"), "status": ("value",)}
STATUSES = ("completed", "diverged", "error")
FIELDS = ("name", "kind", "metric", "at", "op", "value", "level", "tol", "ref", "control_at", "report_only",
          "message_contains", "module_contains")


def signature(exp: dict) -> list[dict]:
    """The checks `exp.expect` names, in its order, each with its `key` (its name in exp.checks:
    what `exp.checks.KEY.value=...` overrides; the verdict line shows it) and its `name` (the
    report's label, the key when it has none; it says what is measured, never the threshold,
    which the verdict renders from the config)."""
    checks = exp["checks"] or {}
    for key, c in checks.items():  # a misspelt field or check name is an error, not a no-op
        for f in c or {}:
            if f not in FIELDS:
                raise ValueError(f"exp.checks.{key}.{f} is not a check field{did_you_mean(f, FIELDS)}")
        if not (c or {}).get("kind"):
            raise ValueError(f"exp.checks.{key} is not a check of {exp['name']}"
                             f"{did_you_mean(key, [k for k in checks if k != key])}")
    out = []
    for key in exp["expect"] or []:
        if key not in checks:
            raise ValueError(f"exp.expect: no check named {key!r} in exp.checks{did_you_mean(key, checks)}")
        c = {"name": key, **checks[key], "key": key}
        validate(key, c)
        out.append(c)
    return out


def validate(key: str, c: dict) -> None:
    where = f"exp.checks.{key}"
    kind = c.get("kind")
    if kind not in KINDS:
        raise ValueError(f"{where}: unknown kind {kind!r} (one of {', '.join(KINDS)})")
    missing = [f for f in NEEDS[kind] if c.get(f) is None]
    if kind not in ("status", "near", "plateau") and c.get("value") is None and not c.get("report_only"):
        missing.append("value")
    if missing:
        raise ValueError(f"{where}: a {kind} check needs {', '.join(missing)}")
    if kind == "status":
        if c["value"] not in STATUSES:
            raise ValueError(f"{where}: status {c['value']!r} is not one of {', '.join(STATUSES)}")
        return
    if c.get("op", ">=") not in OPS:
        raise ValueError(f"{where}: unknown op {c.get('op')!r} (one of {', '.join(OPS)})")
    for f in ("value", "level", "tol"):
        if c.get(f) is not None:
            try:
                parse(c[f])
            except ValueError as e:
                raise ValueError(f"{where}.{f}: {e}") from None
