"""A zoo's triage: every flagged row of a zoo table (any release) assigned to a problem, one cause
each, by the zoo's rules file (the transformers zoo: doctor_lab/zoo/triage.yaml, its fail and warn
rows; a library zoo, doctor_lab/zoo_xt/ and doctor_lab/zoo_diffusers/: every row that is not a
pass or n/a, see Spec). Rows of one problem are counted once as a problem and each as a row. Pure
Python (the report never loads torch)."""
import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

TRIAGE = Path(__file__).resolve().parents[1] / "zoo" / "triage.yaml"
KINDS = {"known": "known behaviour", "false_alarm": "doctor false alarm", "finding": "new finding"}
RULE_KEYS = {"check", "verdict", "impl", "archs", "sides", "cause", "detail"}
OUTCOMES = ("pass", "fail", "warn", "n/a", "inconclusive")
# a target x path the doctor never examined because it raised first (doctor_lab/zoo/worker.py's
# statuses): a library zoo's row with check = the status, verdict `error`, detail = the reason
ERRORS = ("build_error", "forward_error", "doctor_target_error", "doctor_error", "timeout", "crash", "memory")


@dataclass(frozen=True)
class Spec:
    """What one zoo's triage covers. rules: its rules file; kinds: the rows that are problems (the
    verdict classes of outcome(), and `error` for the statuses of ERRORS); absent: words of a
    build error that say the release does not have the target (an option added later: not a row)."""
    rules: Path
    kinds: tuple = ("fail", "warn")
    absent: tuple = ()

    def entries(self) -> list[dict]:
        return load(self.rules)

    def flags(self, results: list[dict], release: str = "") -> list[dict]:
        return flags(results, release, self.kinds, self.absent)

    def is_absent(self, r: dict) -> bool:
        return r["status"] == "build_error" and any(w in r.get("reason", "") for w in self.absent)


def outcome(verdict: str) -> str:
    """A verdict's class: pass, fail, warn; `n/a: why` (the target cannot have the failure);
    `inconclusive: why` (the check applies but could not be performed). Anything else is
    inconclusive: never a pass."""
    head = (verdict or "").strip().split(":", 1)[0].strip()
    return head if head in OUTCOMES else "inconclusive"


def load(path=TRIAGE) -> list[dict]:
    """The entries, checked: a unique id, a kind, its thread or finding, and its rules (the
    entry's own rule keys, or a `match:` list of rules)."""
    entries = yaml.safe_load(Path(path).read_text()) or [] if Path(path).exists() else []
    seen = set()
    for e in entries:
        where = f"{path}: entry {e.get('id')!r}"
        if not e.get("id") or e["id"] in seen:
            raise ValueError(f"{where}: needs an id of its own")
        seen.add(e["id"])
        if e.get("kind") not in KINDS:
            raise ValueError(f"{where}: kind must be one of {', '.join(KINDS)}")
        if e["kind"] == "finding" and not e.get("finding"):
            raise ValueError(f"{where}: a finding names its docs/findings/ page")
        if e["kind"] == "known" and not e.get("thread"):
            raise ValueError(f"{where}: a known behaviour names its thread (or the source that says it)")
        e["rules"] = e.get("match") or [{k: e[k] for k in RULE_KEYS if k in e}]
        for r in e["rules"]:
            if "check" not in r or set(r) - RULE_KEYS:
                raise ValueError(f"{where}: a rule has a check and only {', '.join(sorted(RULE_KEYS))}")
    return entries


def flags(results: list[dict], release: str = "", kinds=("fail", "warn"), absent=()) -> list[dict]:
    """The rows of a zoo table's results whose outcome is one of `kinds` (one per architecture x
    impl x check; with `error` in kinds, one per architecture x impl that raised before the doctor
    could examine it, unless its build error says the release lacks it: words of `absent`)."""
    out = []
    for r in results:
        if r.get("status") != "examined":
            if "error" in kinds and r.get("status") in ERRORS and not (
                    r["status"] == "build_error" and any(w in r.get("reason", "") for w in absent)):
                out.append({"arch": r["arch"], "impl": r["impl"], "check": r["status"], "verdict": "error",
                            "measured": None, "tolerance": "", "detail": r.get("reason") or "", "cause": "",
                            "release": release})
            continue
        for c in r.get("checks", []):
            kind = outcome(c.get("verdict", ""))
            if kind in kinds:
                why = c["verdict"].split(":", 1)[1].strip() if kind == "inconclusive" and ":" in c["verdict"] else ""
                out.append({"arch": r["arch"], "impl": r["impl"], "check": c["name"], "verdict": kind,
                            "measured": c.get("measured"), "tolerance": c.get("tolerance") or "",
                            "detail": "; ".join(x for x in (why, c.get("detail") or "") if x),  # an inconclusive's why first
                            "cause": c.get("cause") or "", "measurements": c.get("measurements") or {},
                            "release": release})
    return out


_NUM = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?|nan|inf)"


def padding_sides(detail: str, tolerance: str, measurements: dict | None = None) -> set[str] | None:
    """Which sides of the padding check moved the real tokens past its tolerance ({'right',
    'left'}): from the row's measurements (right, left, limit: the doctor's schema); in a table
    written before rows carried them, read from its detail; None when neither says (the row then
    matches no rule that names sides: a reason that cannot be checked against the row is not a triage)."""
    m = measurements or {}
    if all(isinstance(m.get(k), (int, float)) for k in ("right", "left", "limit")):
        return {side for side in ("right", "left") if not m[side] <= m["limit"]}
    right = re.search(r"right padding " + _NUM, detail)
    left = re.search(r"left padding " + _NUM + r"(?! with)", detail)
    tol = re.search(r"<=\s*" + _NUM, tolerance or "")
    if not (right and left and tol):
        return None
    limit = float(tol[1])
    return {side for side, m in (("right", right), ("left", left)) if not float(m[1]) <= limit}


def _rule_matches(rule: dict, f: dict) -> bool:
    checks = rule["check"] if isinstance(rule["check"], list) else [rule["check"]]
    if not any(fnmatch.fnmatchcase(f["check"], c) for c in checks):
        return False
    if rule.get("verdict", f["verdict"]) != f["verdict"] or rule.get("impl", f["impl"]) not in (f["impl"], "*"):
        return False
    if not any(fnmatch.fnmatchcase(f["arch"], p) for p in rule.get("archs", ["*"])):
        return False
    if "cause" in rule and f.get("cause") and not any(fnmatch.fnmatchcase(f["cause"], p) for p in rule["cause"]):
        return False  # the doctor named another cause than this entry's
    if "detail" in rule and not re.search(rule["detail"], f["detail"]):
        return False  # the row does not show what this reason is about
    if "sides" in rule:  # the thread explains only these sides: a row failing another is not its
        sides = padding_sides(f["detail"], f["tolerance"], f.get("measurements")) if f["check"] == "padding" else None
        if not sides or not sides <= set(rule["sides"]):
            return False
    return True


def assign(f: dict, entries: list[dict]) -> dict | None:
    """The first entry with a rule that matches the row (None: untriaged)."""
    return next((e for e in entries if any(_rule_matches(r, f) for r in e["rules"])), None)


def problem_key(f: dict, entry: dict | None) -> str:
    """One cause, one key: the entry's id; an untriaged row with a cause the doctor named groups
    under that cause, otherwise under its architecture and check."""
    if entry is not None:
        return entry["id"]
    return f"cause:{f['cause']}" if f.get("cause") else f"untriaged:{f['arch']}:{f['check']}"


def problems(fl: list[dict], entries: list[dict]) -> list[dict]:
    """[{key, entry (None: untriaged), kind, rows}], in the triage's order, untriaged last."""
    order = {e["id"]: i for i, e in enumerate(entries)}
    by: dict[str, dict] = {}
    for f in fl:
        e = assign(f, entries)
        k = problem_key(f, e)
        by.setdefault(k, {"key": k, "entry": e, "kind": e["kind"] if e else "untriaged", "rows": []})["rows"].append(f)
    return sorted(by.values(), key=lambda p: (p["entry"] is None, order.get(p["key"], 0), p["key"]))


def where(rows: list[dict]) -> str:
    """'arch (eager+sdpa), ...' for a problem's rows."""
    by: dict[str, set] = {}
    for f in rows:
        by.setdefault(f["arch"], set()).add(f["impl"])
    return ", ".join(f"{a} ({'+'.join(sorted(i))})" for a, i in sorted(by.items()))


TRANSFORMERS = Spec(TRIAGE)
