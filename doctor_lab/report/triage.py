"""A zoo's triage: every flagged row of a zoo table (any release) assigned to a problem, one cause
each, by the zoo's rules file (the transformers zoo: doctor_lab/zoo/triage.yaml, its fail and warn
rows, and doctor_lab/zoo/inconclusive.yaml, its inconclusive rows, each as a limit of the target,
of this machine or of the doctor; a library zoo, doctor_lab/zoo_xt/ and doctor_lab/zoo_diffusers/:
every row that is not a pass or n/a, see Spec). Rows of one problem are counted once as a problem and each as a row. Pure
Python (the report never loads torch)."""
import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from attention_doctor.result import OUTCOMES as ALL_OUTCOMES
from attention_doctor.result import Row

TRIAGE = Path(__file__).resolve().parents[1] / "zoo" / "triage.yaml"
INCONCLUSIVE = TRIAGE.with_name("inconclusive.yaml")
KINDS = {"known": "known behaviour", "false_alarm": "doctor false alarm", "finding": "new finding"}
# why a check could not look (inconclusive rows): the target's nature or its source says so (thread:
# where), this machine lacks what the target needs (note: what), or the doctor cannot yet (note: what
# it needs); only the last is the doctor's to mend
LIMITS = {"target_limit": "limit of the target", "machine_limit": "limit of this machine",
          "doctor_limit": "limit of the doctor"}
RULE_KEYS = {"check", "verdict", "impl", "archs", "options", "sides", "cause", "error", "measures", "not_run", "releases"}
ENTRY_KEYS = {"id", "kind", "thread", "finding", "note", "match"}
OUTCOMES = tuple(o.value for o in ALL_OUTCOMES)
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
    allowed: tuple = tuple(KINDS)

    def entries(self) -> list[dict]:
        return load(self.rules, self.allowed)

    def flags(self, results: list[dict], release: str = "") -> list[dict]:
        return flags(results, release, self.kinds, self.absent)

    def table_flags(self, z: dict) -> list[dict]:
        """flags() of a zoo table (zoo.json), each row knowing the table's release."""
        return self.flags(z["results"], release_of(z))

    def is_absent(self, r: dict) -> bool:
        return r["status"] == "build_error" and any(w in r.get("reason", "") for w in self.absent)


def row_name(arch: str, options: str = "") -> str:
    """An architecture, or an architecture with the option values it was built with (the option zoo's
    rows, doctor_lab/zoo/options.py): `qwen2[max_window_layers=0+use_sliding_window=true]`. The
    sentinel and the triage key rows by it, as they key architectures."""
    return f"{arch}[{options}]" if options else arch


def release_of(z: dict) -> str:
    """The library release a zoo table was made with (the transformers zoo names it `transformers`)."""
    return z.get("transformers") or z.get("version") or "unknown"


def outcome(c: dict) -> str:
    """A zoo row's outcome (pass, fail, warn, n/a, inconclusive), read by the doctor's one parser
    (Row.from_dict: this schema's `outcome`, an older table's `verdict`); anything else is
    inconclusive, never a pass."""
    return Row.from_dict({"name": "", **c}).outcome.value


def load(path=TRIAGE, allowed=tuple(KINDS)) -> list[dict]:
    """The entries, checked: a unique id, a kind of `allowed`, its thread or finding (a limit of
    the target its thread too), a limit its note, and its rules (the entry's own rule keys, or a
    `match:` list of rules)."""
    entries = yaml.safe_load(Path(path).read_text()) or [] if Path(path).exists() else []
    seen = set()
    for e in entries:
        where = f"{path}: entry {e.get('id')!r}"
        if not e.get("id") or e["id"] in seen:
            raise ValueError(f"{where}: needs an id of its own")
        seen.add(e["id"])
        if e.get("kind") not in allowed:
            raise ValueError(f"{where}: kind must be one of {', '.join(allowed)}")
        if e["kind"] == "finding" and not e.get("finding"):
            raise ValueError(f"{where}: a finding names its docs/findings/ page")
        if e["kind"] in ("known", "target_limit") and not e.get("thread"):
            raise ValueError(f"{where}: a {(KINDS | LIMITS)[e['kind']]} names its thread (or the source that says it)")
        if e["kind"] in LIMITS and not e.get("note"):
            raise ValueError(f"{where}: needs a note (what stops the check, and what would let it look)")
        if set(e) - RULE_KEYS - ENTRY_KEYS:
            raise ValueError(f"{where}: unknown keys {', '.join(sorted(set(e) - RULE_KEYS - ENTRY_KEYS))}")
        e["rules"] = e.get("match") or [{k: e[k] for k in RULE_KEYS if k in e}]
        for r in e["rules"]:
            if "check" not in r or set(r) - RULE_KEYS:
                raise ValueError(f"{where}: a rule has a check and only {', '.join(sorted(RULE_KEYS))}")
    return entries


def flags(results: list[dict], release: str = "", kinds=("fail", "warn"), absent=()) -> list[dict]:
    """The rows of a zoo table's results whose outcome is one of `kinds` (one per architecture x
    impl x check; with `error` in kinds, one per architecture x impl that raised before the doctor
    could examine it, unless its build error says the release lacks it: words of `absent`). A row
    as the doctor's schema reads it (Row.from_dict): outcome, reason, cause, measurements; a status
    row's error (the library's exception, as the worker recorded it) in measurements["error"]."""
    out = []
    for r in results:
        opts = {"options": r["option_label"]} if r.get("option_label") else {}
        if r.get("status") != "examined":
            if "error" in kinds and r.get("status") in ERRORS and not (
                    r["status"] == "build_error" and any(w in r.get("reason", "") for w in absent)):
                out.append({"arch": r["arch"], "impl": r["impl"], "check": r["status"], "verdict": "error",
                            "measured": None, "tolerance": "", "detail": r.get("reason") or "", "cause": "",
                            "measurements": {"error": r.get("reason") or ""}, "release": release, **opts})
            continue
        for c in r.get("checks", []):
            row = Row.from_dict(c)
            kind = row.outcome.value
            if kind in kinds:
                out.append({"arch": r["arch"], "impl": r["impl"], "check": row.name, "verdict": kind,
                            "measured": row.measured, "tolerance": row.tolerance,
                            "detail": "; ".join(x for x in (row.reason, row.detail) if x),  # for people: never matched
                            "cause": row.cause, "measurements": row.measurements, "release": release, **opts})
    return out


def padding_sides(measurements: dict | None) -> set[str] | None:
    """Which sides of the padding check moved the real tokens past its limit ({'right', 'left'}),
    from the row's measurements (right, left, limit: the doctor's schema); None when they do not
    say (the row then matches no rule that names sides: a reason that cannot be checked against the
    row is not a triage)."""
    m = measurements or {}
    if not all(isinstance(m.get(k), (int, float)) for k in ("right", "left", "limit")):
        return None
    return {side for side in ("right", "left") if not m[side] <= m["limit"]}


def errors(measurements: dict) -> list[str]:
    """The exceptions a row carries, in the words of the code that raised (never the doctor's):
    its `error`, each run's `raised` (low_precision's runs), the values of `not_run` (why a part
    could not run: the target's exception where it raised)."""
    found = []

    def walk(x, key=""):
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, "not_run" if key == "not_run" else k)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v, key)
        elif isinstance(x, str) and key in ("error", "raised", "not_run"):
            found.append(x)
    walk(measurements)
    return found


def _measure_matches(want, got) -> bool:
    """A rule's `measures` value against a row's measurement: a dict, a record (or one record of a
    list of them) holding each of its items; a list of dicts, each so; [lo, hi], a number in that
    range; a string, an fnmatch pattern of the value; None, absent; else equal."""
    if isinstance(want, list) and want and all(isinstance(w, dict) for w in want):
        return all(_measure_matches(w, got) for w in want)
    if isinstance(want, dict):
        if isinstance(got, list):
            return any(_measure_matches(want, g) for g in got)
        return isinstance(got, dict) and all(_measure_matches(v, got.get(k)) for k, v in want.items())
    if isinstance(want, list) and len(want) == 2 and all(isinstance(w, (int, float)) for w in want):
        return isinstance(got, (int, float)) and not isinstance(got, bool) and want[0] <= got <= want[1]
    if isinstance(want, str):
        return got is not None and fnmatch.fnmatchcase(str(got), want)
    return want == got


def _rule_matches(rule: dict, f: dict) -> bool:
    checks = rule["check"] if isinstance(rule["check"], list) else [rule["check"]]
    if not any(fnmatch.fnmatchcase(f["check"], c) for c in checks):
        return False
    if rule.get("verdict", f["verdict"]) != f["verdict"] or rule.get("impl", f["impl"]) not in (f["impl"], "*"):
        return False
    archs = rule.get("archs", ["*"])
    if not any(fnmatch.fnmatchcase(f["arch"], p) for p in archs if not p.startswith("!")) or any(
            fnmatch.fnmatchcase(f["arch"], p[1:]) for p in archs if p.startswith("!")):
        return False  # `!pattern`: not these architectures (another entry explains them first)
    if "options" in rule:   # the option zoo's rows: fnmatch patterns of the option label ("" the default)
        got = f.get("options", "")
        if not any(fnmatch.fnmatchcase(got, p) for p in rule["options"] if not p.startswith("!")) or any(
                fnmatch.fnmatchcase(got, p[1:]) for p in rule["options"] if p.startswith("!")):
            return False
    if "cause" in rule and f.get("cause") and not any(fnmatch.fnmatchcase(f["cause"], p) for p in rule["cause"]):
        return False  # the doctor named another cause than this entry's
    m = f.get("measurements") or {}
    if "error" in rule and not any(re.search(rule["error"], e) for e in errors(m)):
        return False  # the row does not carry the exception this reason is about
    if "measures" in rule and not all(_measure_matches(v, m.get(k)) for k, v in rule["measures"].items()):
        return False  # the row's measurements are not what this reason is about
    if "not_run" in rule and not any(fnmatch.fnmatchcase(part, p) for part in (m.get("not_run") or {})
                                     for p in rule["not_run"]):
        return False  # the part this reason says could not run is not the row's
    if "releases" in rule and not any(fnmatch.fnmatchcase(f.get("release") or "", p) for p in rule["releases"]):
        return False  # the thread explains the rows of these releases only (fnmatch patterns: "4.*")
    if "sides" in rule:  # the thread explains only these sides: a row failing another is not its
        sides = padding_sides(m) if f["check"] == "padding" else None
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
    return f"cause:{f['cause']}" if f.get("cause") else f"untriaged:{row_name(f['arch'], f.get('options', ''))}:{f['check']}"


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
        by.setdefault(row_name(f["arch"], f.get("options", "")), set()).add(f["impl"])
    return ", ".join(f"{a} ({'+'.join(sorted(i))})" for a, i in sorted(by.items()))


TRANSFORMERS = Spec(TRIAGE)
TRANSFORMERS_INCONCLUSIVE = Spec(INCONCLUSIVE, ("inconclusive",), allowed=tuple(LIMITS))
