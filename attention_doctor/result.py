"""A doctor's result, the one schema every reader uses: one Row per check, printed as a table,
written as JSON and read back (Row.from_dict, DoctorResult.from_dict / from_json: this file's
format and the older one whose rows held only `"verdict": "n/a: why"`). Torch-free.

Outcomes, one meaning each (docs/doctor.md, "Outcomes and exit codes"):
  pass          the check ran on this target and held
  fail          it ran and found the failure (`cause` names which pattern broke)
  warn          it ran and held only with what the caller must pass (e.g. position ids from the
                mask); without it the failure shows: the row says what to pass
  n/a           the target cannot have this failure or lacks the interface by nature (no KV
                cache, no padding mask, not causal); `reason` says what would enable it
  inconclusive  the check applies, or may apply, but the doctor could not perform it (it could
                not see the scores, its own code raised, a part of it could not run); `reason` says why

A row: name; outcome; reason (n/a and inconclusive: why); cause (a name from the check's record
or the common causes, attention_doctor.checks.record); measured and tolerance (the number judged
and how); measurements (named values, declared per check in its record: the same names whatever
the wording of detail); experiment and thread (from the check's record); detail (prose for
people, never parsed). `verdict` ("pass", "n/a: why") is derived, for display.
"""
import json
import math
import re
import textwrap
from dataclasses import dataclass, field
from enum import Enum

SCHEMA = 2   # the JSON's version: 1 (no `schema` key) held the outcome and reason in `verdict` alone


class Outcome(str, Enum):
    """A check's outcome (a str: compares equal to its value)."""
    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    NA = "n/a"
    INCONCLUSIVE = "inconclusive"

    def __str__(self):
        return self.value

    def __format__(self, spec):
        return format(self.value, spec)


PASS, FAIL, WARN, NA, INCONCLUSIVE = Outcome
OUTCOMES = tuple(Outcome)
# exit codes (the CLI's, and DoctorResult.exit_code); 2 is the CLI's alone: no result at all
EXIT_OK, EXIT_FAILED, EXIT_UNUSABLE, EXIT_INCONCLUSIVE = 0, 1, 2, 3
# what a check held to (measured or judged): the outcomes that count in info["checks_run"]
RAN = (PASS, FAIL, WARN)


def parse_verdict(verdict: str) -> tuple[Outcome, str]:
    """(outcome, reason) of a display verdict ("pass", "n/a: why"); an older doctor's `skip: why`
    is inconclusive, and so is anything not an outcome: never a pass."""
    head, _, why = (verdict or "").partition(":")
    head, why = head.strip(), why.strip()
    try:
        return Outcome(head), why
    except ValueError:
        return INCONCLUSIVE, (verdict or "").strip()


def _to_json(x):
    """JSON has no NaN or inf: they are written as the strings "nan", "inf", "-inf"."""
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return str(x)
    if isinstance(x, dict):
        return {k: _to_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_to_json(v) for v in x]
    return x


def _from_json(x):
    if x in ("nan", "inf", "-inf"):
        return float(x)
    if isinstance(x, dict):
        return {k: _from_json(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_from_json(v) for v in x]
    return x


@dataclass
class Row:
    """One check's outcome (the module docstring lists the fields)."""
    name: str
    outcome: Outcome
    reason: str = ""
    cause: str = ""
    measured: float | None = None
    tolerance: str = ""
    measurements: dict = field(default_factory=dict)
    experiment: str = ""
    thread: str = ""
    detail: str = ""

    def __post_init__(self):
        self.outcome = Outcome(self.outcome)

    @property
    def verdict(self) -> str:
        """The outcome with its reason, for display: `pass`, `n/a: why`, `inconclusive: why`."""
        return f"{self.outcome.value}: {self.reason}" if self.reason else self.outcome.value

    @property
    def failed(self) -> bool:
        return self.outcome is FAIL

    @property
    def inconclusive(self) -> bool:
        return self.outcome is INCONCLUSIVE

    @property
    def not_applicable(self) -> bool:
        return self.outcome is NA

    def to_dict(self) -> dict:
        """The JSON form (non-finite numbers as strings; `verdict` derived, for readers of the
        older format)."""
        return _to_json({"name": self.name, "outcome": self.outcome.value, "reason": self.reason, "cause": self.cause,
                         "measured": self.measured, "tolerance": self.tolerance, "measurements": self.measurements,
                         "experiment": self.experiment, "thread": self.thread, "detail": self.detail,
                         "verdict": self.verdict})

    @classmethod
    def from_dict(cls, d: dict) -> "Row":
        """A row from its JSON form, this one or the older one (`verdict` holding the outcome and
        its reason, no measurements)."""
        if "outcome" in d:
            outcome, reason = Outcome(d["outcome"]), d.get("reason", "")
        else:
            outcome, reason = parse_verdict(d.get("verdict", ""))
        return cls(d["name"], outcome, reason, d.get("cause") or "", _from_json(d.get("measured")),
                   d.get("tolerance") or "", _from_json(d.get("measurements") or {}), d.get("experiment") or "",
                   d.get("thread") or "", d.get("detail") or "")


WIDTH = 100   # a terminal's and a pull request's width


def _baseline_note(j) -> str:
    """What the baseline says of a judged row's check, for the table's notes."""
    if j.status.value == "expected":
        return f"as the baseline expects: {j.expected.reason}"
    if j.status.value == "fixed":
        return f"the baseline expects {j.expected.said}: it did not happen"
    return f"the baseline expects {j.expected.said}"


def _short(tolerance: str, n: int = 14) -> str:
    """A tolerance's value for the table's column (its text up to the first `:`, `;` or `(`), or
    "" where that is longer than n: the whole text goes to the notes."""
    head = re.split(r"[:;(]", tolerance, maxsplit=1)[0].strip()
    return head if len(head) <= n else ""


def _wrapped(text: str, width: int, indent: str = "") -> list[str]:
    return textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False) or [""]


def _num(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return str(x)
    return f"{x:.3g}"


@dataclass
class DoctorResult:
    """What examine() found: `checks`, one Row per check run, in order; `info`, what the doctor
    found out about the target (kind, attention implementation, calls seen, its description,
    timings); `baseline`, the expected outcomes it is judged against (attention_doctor.baseline;
    None: every fail and inconclusive counts); `baseline_json`, a baseline's JSON form as read back
    with the result (attention_doctor.baseline.read_result makes it a baseline again: this module
    sits below the baseline's, which needs the checks' registry)."""
    target: str
    checks: list[Row] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    baseline: object = None
    baseline_json: dict | None = None

    def judged(self) -> list:
        """Each row judged against the baseline (attention_doctor.baseline.Judged); [] without one."""
        return self.baseline.judge(self) if self.baseline is not None else []

    def _status(self, *statuses) -> list[Row]:
        return [j.row for j in self.judged() if j.status in statuses]

    @property
    def failed(self) -> list[Row]:
        """The rows that failed."""
        return [r for r in self.checks if r.failed]

    @property
    def inconclusive(self) -> list[Row]:
        """The rows the doctor could not perform (never a pass)."""
        return [r for r in self.checks if r.inconclusive]

    @property
    def exit_code(self) -> int:
        """1 if a check failed; else 3 if a check was inconclusive; else 0. With a baseline: 1 if a
        check failed in a way it does not expect (under its strict, also if an expected failure did
        not happen); else 3 if a check was inconclusive and it does not expect that; else 0."""
        if self.baseline is None:
            return EXIT_FAILED if self.failed else EXIT_INCONCLUSIVE if self.inconclusive else EXIT_OK
        if self._status("unexpected") or (self.baseline.strict and self._status("fixed")):
            return EXIT_FAILED
        return EXIT_INCONCLUSIVE if self._status("inconclusive") else EXIT_OK

    @property
    def ok(self) -> bool:
        """Every applicable check ran and held (exit code 0)."""
        return self.exit_code == EXIT_OK

    def __getitem__(self, name: str) -> Row:
        for r in self.checks:
            if r.name == name:
                return r
        raise KeyError(name)

    def verdicts(self) -> dict[str, str]:
        """{check: verdict}."""
        return {r.name: r.verdict for r in self.checks}

    def outcomes(self) -> dict[str, Outcome]:
        """{check: outcome}."""
        return {r.name: r.outcome for r in self.checks}

    def to_dict(self) -> dict:
        """The JSON form: schema, target, exit_code, the rows (Row.to_dict), info."""
        d = {"schema": SCHEMA, "target": self.target, "exit_code": self.exit_code,
             "checks": [r.to_dict() for r in self.checks], "info": _to_json(self.info)}
        if self.baseline is not None:   # what it was judged against, and how each row was judged
            d["baseline"] = {**self.baseline.to_dict(), "path": self.baseline.path,
                             "judged": {j.row.name: j.status.value for j in self.judged()}}
        elif self.baseline_json is not None:
            d["baseline"] = self.baseline_json
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "DoctorResult":
        """A result from its JSON form (this schema or the older one; its exit code is derived, without
        the baseline it was judged against: attention_doctor.baseline.read_result judges it again)."""
        return cls(d.get("target", ""), [Row.from_dict(c) for c in d.get("checks", [])], _from_json(d.get("info") or {}),
                   baseline_json=d.get("baseline"))

    def to_json(self, path=None) -> str:
        """to_dict() as JSON text, also written to `path` when given."""
        text = json.dumps(self.to_dict(), indent=1) + "\n"
        if path is not None:
            with open(path, "w") as f:
                f.write(text)
        return text

    @classmethod
    def from_json(cls, text_or_path) -> "DoctorResult":
        """from_dict of JSON text, or of the file at a path."""
        text = str(text_or_path)
        if not text.lstrip().startswith("{"):
            with open(text) as f:
                text = f.read()
        return cls.from_dict(json.loads(text))

    def header(self) -> str:
        """The target and what the doctor saw of its attention (the table's first line)."""
        i = self.info
        seen = i.get("attention_calls")
        seen = (", ".join(f"{n} {s}" for s, n in sorted(seen.items())) if seen else "none") if seen is not None else None
        parts = [f"attention: {i['implementation']}" if i.get("implementation") else None,
                 f"calls seen: {seen}" if seen is not None else None]
        parts = [p for p in parts if p]
        return f"attention doctor: {self.target}" + (f" ({'; '.join(parts)})" if parts else "")

    def summary(self) -> str:
        """What the exit code says, in words: the failed rows with their causes, the
        inconclusive ones with why."""
        out = []
        named = lambda rows: ", ".join(r.name + (f" ({r.cause})" if r.cause else "") for r in rows)
        failed, blind = self.failed, self.inconclusive
        if self.baseline is not None:
            expected, fixed = self._status("expected"), self._status("fixed")
            failed, blind = self._status("unexpected"), self._status("inconclusive")
            if expected:
                out.append(f"{len(expected)} as the baseline expects: {named(expected)}")
            if fixed:
                out.append(f"{len(fixed)} expected by the baseline did not happen"
                           f"{' (strict: a failure)' if self.baseline.strict else ''}: {named(fixed)}")
        if failed:
            out.append(f"{len(failed)} failed: {named(failed)}")
        if blind:
            out.append(f"{len(blind)} inconclusive (the doctor could not perform them; never a pass): {named(blind)}")
        if not failed and not blind:
            warned = [r.name for r in self.checks if r.outcome is WARN]
            out.append("nothing failed" + (f"; read the warning: {', '.join(warned)}" if warned else ""))
        return "\n".join(out)

    def table(self, threads: bool = True, width: int = WIDTH) -> str:
        """The rows as a fixed-width text table (the CLI's output) at most `width` columns wide:
        header, one row per check (outcome, cause, measured, tolerance), then every reason, long
        tolerance, experiment to reproduce and thread as numbered notes, then the summary."""
        head, body, notes = self.cells(threads)
        widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
        line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
        out = [*_wrapped(self.header(), width), line(head), line(["-" * w for w in widths])]
        out += [line(b) for b in body]
        for i, n in enumerate(notes, 1):
            out += _wrapped(f"[{i}] {n}", width, indent=" " * (len(str(i)) + 3))
        for said in self.summary().splitlines():
            out += _wrapped(said, width)
        return "\n".join(out)

    def cells(self, threads: bool = True) -> tuple[list[str], list[list[str]], list[str]]:
        """The table's cells (head, one row per check, the numbered notes), for table() and the
        other formats (attention_doctor.formats)."""
        head = ["check", "outcome", "cause", "measured", "tolerance", "note"]
        body, notes = [], []
        judged = {j.row.name: j for j in self.judged()}
        for r in self.checks:
            tol = _short(r.tolerance)
            j = judged.get(r.name)
            said = [r.reason, f"tolerance {r.tolerance}" if tol != r.tolerance else "",
                    _baseline_note(j) if j is not None and j.expected is not None else "",
                    f"reproduce: +exp={r.experiment}" if r.experiment else "",
                    f"thread: {r.thread}" if threads and r.thread else ""]
            said = "; ".join(p for p in said if p)
            if said:
                notes.append(said)
            body.append([r.name, r.outcome.value, r.cause or "-", _num(r.measured), tol or "-",
                         f"[{len(notes)}]" if said else ""])
        return head, body, notes

    def details(self) -> str:
        """Each row's detail, one line per check."""
        return "\n".join(f"- {r.name}: {r.detail}" for r in self.checks if r.detail)

    def assert_healthy(self, allow=(), allow_inconclusive=()):
        """Raise AssertionError with the table when a check failed (unless named in `allow`, or the
        baseline expects it) or was inconclusive (unless named in `allow_inconclusive`, or that is
        True: any; or the baseline expects it); under the baseline's strict also when a failure it
        expects did not happen. Returns self."""
        failed, blind = self.failed, self.inconclusive
        if self.baseline is not None:
            failed = self._status("unexpected") + (self._status("fixed") if self.baseline.strict else [])
            blind = self._status("inconclusive")
        bad = [r for r in failed if r.name not in allow]
        bad += [r for r in blind if allow_inconclusive is not True and r.name not in allow_inconclusive]
        if bad:
            what = ("a failure" if any(r.failed for r in bad) else "a check it could not perform"
                    if any(r.inconclusive for r in bad) else "an expected failure that did not happen (strict baseline)")
            raise AssertionError(f"attention doctor found {what}:\n" + self.table() + "\n" + "\n".join(
                f"- {r.name}: {r.verdict}: {r.detail}" for r in bad))
        return self
