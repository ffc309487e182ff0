"""Expected outcomes as data: a baseline file beside a project's tests, one entry per check that is
expected not to pass, with the cause expected and why (PyTorch's OpInfo keeps expected failures
beside each op, with the reason; pytest has xfail(strict=True)):

    {"strict": false,
     "expected": [
      {"check": "low_precision", "outcome": "fail", "cause": "qk_before_scale",
       "reason": "eager q.k^T in float16 before the scale; fixed once we upcast",
       "thread": "huggingface/transformers#33317",
       "releases": ["torch==2.13.*"], "targets": ["*eager*"]}]}

check: a check name (attention_doctor.checks.ORDER); outcome: fail (default), warn or
inconclusive; cause: a cause or a list of fnmatch patterns (absent: any cause); reason: why, for
the person who reads the report; thread (optional): where it is discussed; releases (optional):
`distribution==pattern` items, the entry holds where one matches the installed version; targets
(optional): fnmatch patterns of the result's target name (a config, a test id). Of the entries
that hold for a check, the first that matches its row is its expectation, else the first.

Judged against a result, each row is: ok (it holds, nothing expected), expected (it failed as
the entry says: xfail), unexpected (a fail nothing expects, or with another outcome or cause),
inconclusive (the doctor could not look, and nothing expects that), fixed (an entry expects a
failure that did not happen: reported, and a failure under strict, as xfail(strict=True)).

JSON because the package reads it with the standard library (it depends on torch only; YAML would
need PyYAML). The zoo's triage entries (doctor_lab/zoo/triage.yaml) read as these records
(from_triage) where the two say the same thing: check, outcome, cause, release, target, reason,
thread. Torch-free."""
import fnmatch
import json
from dataclasses import dataclass, field
from enum import Enum
from importlib import metadata
from pathlib import Path

from attention_doctor.result import FAIL, INCONCLUSIVE, WARN, DoctorResult, Outcome, Row

EXPECTABLE = (FAIL, WARN, INCONCLUSIVE)
KEYS = ("check", "outcome", "cause", "reason", "thread", "releases", "targets", "id")


class Status(str, Enum):
    """A row judged against a baseline."""
    OK = "ok"
    EXPECTED = "expected"
    UNEXPECTED = "unexpected"
    INCONCLUSIVE = "inconclusive"
    FIXED = "fixed"

    def __str__(self):
        return self.value


def _patterns(x) -> tuple[str, ...]:
    return (x,) if isinstance(x, str) else tuple(x or ())


def installed(dist: str) -> str | None:
    """The installed version of a distribution (None: not installed)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Expected:
    """One baseline entry (the module docstring says each field)."""
    check: str
    cause: tuple[str, ...] = ()
    reason: str = ""
    outcome: Outcome = FAIL
    thread: str = ""
    releases: tuple[str, ...] = ()
    targets: tuple[str, ...] = ()
    id: str = ""

    def __post_init__(self):
        object.__setattr__(self, "outcome", Outcome(self.outcome))
        for k in ("cause", "releases", "targets"):
            object.__setattr__(self, k, _patterns(getattr(self, k)))

    def holds_for(self, target: str, version=installed) -> bool:
        """Whether this entry speaks for `target` here: its targets match the name and one of its
        releases matches the installed version (`version(dist)` -> str or None)."""
        if self.targets and not any(fnmatch.fnmatchcase(target, p) for p in self.targets):
            return False
        if not self.releases:
            return True
        for item in self.releases:
            dist, _, pattern = item.partition("==")
            got = version(dist.strip())
            if got is not None and fnmatch.fnmatchcase(got, pattern.strip() or "*"):
                return True
        return False

    def matches(self, row: Row) -> bool:
        """The row has the outcome expected and a cause expected."""
        return row.outcome is self.outcome and (not self.cause or any(
            fnmatch.fnmatchcase(row.cause or "", p) for p in self.cause))

    @property
    def said(self) -> str:
        """What is expected, in words: `fail (qk_before_scale): why; thread`."""
        what = f"{self.outcome.value} ({' or '.join(self.cause)})" if self.cause else f"{self.outcome.value} (any cause)"
        return f"{what}: {self.reason}" + (f"; thread: {self.thread}" if self.thread else "")

    def to_dict(self) -> dict:
        d = {"check": self.check, "outcome": self.outcome.value,
             "cause": self.cause[0] if len(self.cause) == 1 else list(self.cause), "reason": self.reason,
             "thread": self.thread, "releases": list(self.releases), "targets": list(self.targets), "id": self.id}
        return {k: v for k, v in d.items() if v or k in ("check", "outcome", "reason")}

    @classmethod
    def from_dict(cls, d: dict, where: str = "baseline") -> "Expected":
        """An entry from its JSON form; a ValueError (one line, saying where) if it is not one."""
        from attention_doctor.checks import ORDER
        if not isinstance(d, dict):
            raise ValueError(f"{where}: an entry is an object with a check and a reason, not {d!r}")
        unknown = sorted(set(d) - set(KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} (an entry has {', '.join(KEYS)})")
        if d.get("check") not in ORDER:
            raise ValueError(f"{where}: check {d.get('check')!r} is not one of the doctor's ({', '.join(ORDER)})")
        if not isinstance(d.get("reason"), str):
            raise ValueError(f"{where}: {d['check']} needs a reason (why it is expected)")
        try:
            outcome = Outcome(d.get("outcome", "fail"))
        except ValueError:
            outcome = None
        if outcome not in EXPECTABLE:
            raise ValueError(f"{where}: {d['check']}: outcome {d.get('outcome')!r} is not one of "
                             f"{', '.join(o.value for o in EXPECTABLE)}")
        return cls(d["check"], _patterns(d.get("cause")), d["reason"], outcome, d.get("thread") or "",
                   _patterns(d.get("releases")), _patterns(d.get("targets")), d.get("id") or "")


@dataclass
class Judged:
    """A row, what the baseline expected of its check (None: nothing), and the status that follows."""
    row: Row
    status: Status
    expected: Expected | None = None

    def message(self) -> str:
        """One line: the check, its outcome and cause, and what was expected."""
        r, e = self.row, self.expected
        got = r.outcome.value + (f" ({r.cause})" if r.cause else "") + (f": {r.reason}" if r.reason else "")
        if self.status is Status.EXPECTED:
            return f"{r.name}: {got}, as the baseline expects: {e.reason}"
        if self.status is Status.FIXED:
            return f"{r.name}: {got}; the baseline expects {e.said} (edit the baseline)"
        if e is not None:
            return f"{r.name}: {got}; the baseline expects {e.said}"
        return f"{r.name}: {got}"


@dataclass
class Baseline:
    """A baseline: its entries in order; strict: an expected failure that did not happen fails."""
    entries: list[Expected] = field(default_factory=list)
    strict: bool = False
    path: str = ""

    def expected(self, row: Row, target: str = "", version=installed) -> Expected | None:
        """What the baseline expects of a row's check for `target` here: the first entry that holds
        and matches the row, else the first that holds (None: nothing expected)."""
        held = [e for e in self.entries if e.check == row.name and e.holds_for(target, version)]
        return next((e for e in held if e.matches(row)), held[0] if held else None)

    def judge(self, result, version=installed) -> list[Judged]:
        """Each row of a DoctorResult judged against the entries that hold for its target."""
        return [judge_row(r, self.expected(r, result.target, version)) for r in result.checks]

    def to_dict(self) -> dict:
        return {"strict": self.strict, "expected": [e.to_dict() for e in self.entries]}

    def save(self, path) -> Path:
        p = Path(path)
        p.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return p

    @classmethod
    def from_dict(cls, d, where: str = "baseline") -> "Baseline":
        if isinstance(d, list):   # a bare list of entries
            d = {"expected": d}
        if not isinstance(d, dict) or not isinstance(d.get("expected", []), list):
            raise ValueError(f"{where}: a baseline is {{\"strict\": false, \"expected\": [entries]}}")
        unknown = sorted(set(d) - {"strict", "expected", "about"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} (a baseline has strict, expected, about)")
        entries = [Expected.from_dict(e, f"{where}: entry {i + 1}") for i, e in enumerate(d.get("expected", []))]
        return cls(entries, bool(d.get("strict", False)), where)

    @classmethod
    def load(cls, path) -> "Baseline":
        """A baseline file; a ValueError of one line when it cannot be read or is not one."""
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ValueError(f"baseline {path}: cannot be read ({e.strerror or e})") from None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"baseline {path}: not JSON ({e.msg}, line {e.lineno})") from None
        return cls.from_dict(d, str(path))


def of(baseline) -> Baseline | None:
    """A Baseline from a path, a dict, or a Baseline (None stays None)."""
    if baseline is None or isinstance(baseline, Baseline):
        return baseline
    if isinstance(baseline, (dict, list)):
        return Baseline.from_dict(baseline)
    return Baseline.load(baseline)


def judge_row(row: Row, expected: Expected | None) -> Judged:
    if expected is not None and expected.matches(row):
        return Judged(row, Status.EXPECTED, expected)
    if row.outcome is FAIL:
        return Judged(row, Status.UNEXPECTED, expected)
    if row.outcome is INCONCLUSIVE:
        return Judged(row, Status.INCONCLUSIVE, expected)
    return Judged(row, Status.FIXED if expected is not None else Status.OK, expected)


def draft(result, reason: str = "TODO: why this is expected, and until when") -> Baseline:
    """Today's rows that would stop a gate (fail, inconclusive) as a baseline for a person to edit:
    each with its cause and the check's thread (no targets: the file speaks for the model it is
    beside; add targets where one file serves several)."""
    return Baseline([Expected(r.name, (r.cause,) if r.cause else (), reason, r.outcome, r.thread)
                     for r in result.checks if r.outcome in (FAIL, INCONCLUSIVE)])


def read_result(text_or_path) -> DoctorResult:
    """A result written as JSON (DoctorResult.to_json), with the baseline it was judged against
    made a Baseline again, so that its exit code and rows are judged as when it was written."""
    r = DoctorResult.from_json(text_or_path)
    if r.baseline_json is not None:
        b = {k: v for k, v in r.baseline_json.items() if k in ("strict", "expected")}
        r.baseline = Baseline.from_dict(b, r.baseline_json.get("path") or "baseline")
    return r


def from_triage(entry: dict) -> list[Expected]:
    """A zoo triage entry (doctor_lab/zoo/triage.yaml, as loaded) read as baseline entries: one per
    rule and check, with what both formats say (check, verdict -> outcome, cause, releases of
    transformers, archs and impl -> targets `hf:ARCH IMPL`, note -> reason, thread or finding page,
    id). The triage's finer rules (error, measures, sides, not_run) have no baseline form."""
    from attention_doctor.checks import ORDER
    rules = entry.get("rules") or entry.get("match") or [{k: v for k, v in entry.items() if k not in ("id", "note")}]
    out = []
    for rule in rules:
        targets = tuple(f"hf:{a} {rule.get('impl', '*')}" for a in rule.get("archs", ["*"]) if not a.startswith("!"))
        for pattern in _patterns(rule["check"]):
            for check in fnmatch.filter(ORDER, pattern):
                for outcome in _patterns(rule.get("verdict") or ("fail", "warn")):   # no verdict: either
                    out.append(Expected(check, _patterns(rule.get("cause")), entry.get("note", ""), Outcome(outcome),
                                        entry.get("thread") or entry.get("finding") or "",
                                        tuple(f"transformers=={p}" for p in rule.get("releases", ())), targets,
                                        entry.get("id", "")))
    return out
