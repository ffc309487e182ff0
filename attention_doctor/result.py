"""A doctor's result: one row per check, printed as a table, written as JSON, asserted in a test.

Outcomes, one meaning each (docs/doctor.md, "Outcomes and exit codes"):
  pass               the check ran on this target and held
  fail               it ran and found the failure (`cause` names which pattern broke)
  warn               it ran and held only with what the caller must pass (e.g. position ids from
                     the mask); without it the failure shows: the row says what to pass
  n/a: why           the target cannot have this failure or lacks the interface by nature (no
                     KV cache, no padding mask, not causal); `why` says what would enable it
  inconclusive: why  the check applies, or may apply, but the doctor could not perform it (it
                     could not see the scores, its own code raised, a part of it could not run)
"""
import json
import math
from dataclasses import asdict, dataclass, field

PASS, FAIL, WARN, NA, INCONCLUSIVE = "pass", "fail", "warn", "n/a", "inconclusive"
OUTCOMES = (PASS, FAIL, WARN, NA, INCONCLUSIVE)   # n/a and inconclusive carry ": why"
# exit codes (the CLI's, and DoctorResult.exit_code); 2 is the CLI's alone: no result at all
EXIT_OK, EXIT_FAILED, EXIT_UNUSABLE, EXIT_INCONCLUSIVE = 0, 1, 2, 3


@dataclass
class Row:
    """One check's outcome. verdict: `pass`, `fail`, `warn`, `n/a: why` or `inconclusive: why`;
    measured: the number judged (None when nothing was); tolerance: how it was judged, e.g.
    "<= 1e-06"; experiment: the catalogue's `python run.py +exp=NAME` that reproduces the failure
    this check looks for; thread: the public issue where it was shipped; detail: what was
    measured, in words; cause: which pattern broke or why the check could not run, a short
    machine-readable name the check's registry record explains (docs/doctor.md), "" if none."""
    name: str
    verdict: str
    measured: float | None = None
    tolerance: str = ""
    experiment: str = ""
    thread: str = ""
    detail: str = ""
    cause: str = ""

    @property
    def outcome(self) -> str:
        """The verdict without its reason: one of OUTCOMES."""
        return self.verdict.split(":", 1)[0]

    @property
    def failed(self) -> bool:
        return self.outcome == FAIL

    @property
    def inconclusive(self) -> bool:
        return self.outcome == INCONCLUSIVE

    @property
    def not_applicable(self) -> bool:
        return self.outcome == NA


def _num(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return str(x)
    return f"{x:.3g}"


def _json_num(x):
    """JSON has no NaN or inf: they are written as strings."""
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return str(x)
    return x


@dataclass
class DoctorResult:
    """What examine() found: `checks`, one Row per check run, in order; `info`, what the doctor
    found out about the target (kind, attention implementation, calls seen, causal, timings)."""
    target: str
    checks: list[Row] = field(default_factory=list)
    info: dict = field(default_factory=dict)

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
        """1 if a check failed; else 3 if a check was inconclusive; else 0."""
        return EXIT_FAILED if self.failed else EXIT_INCONCLUSIVE if self.inconclusive else EXIT_OK

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

    def to_dict(self) -> dict:
        """The JSON form: target, exit_code, the rows (NaN and inf as strings), info."""
        rows = [{k: _json_num(v) for k, v in asdict(r).items()} for r in self.checks]
        return {"target": self.target, "exit_code": self.exit_code, "checks": rows, "info": self.info}

    def to_json(self, path=None) -> str:
        """to_dict() as JSON text, also written to `path` when given."""
        text = json.dumps(self.to_dict(), indent=1) + "\n"
        if path is not None:
            with open(path, "w") as f:
                f.write(text)
        return text

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
        if self.failed:
            out.append(f"{len(self.failed)} failed: " + ", ".join(
                r.name + (f" ({r.cause})" if r.cause else "") for r in self.failed))
        if self.inconclusive:
            out.append(f"{len(self.inconclusive)} inconclusive (the doctor could not perform them; never a pass): "
                       + ", ".join(r.name + (f" ({r.cause})" if r.cause else "") for r in self.inconclusive))
        if not out:
            warned = [r.name for r in self.checks if r.outcome == WARN]
            out.append("nothing failed" + (f"; read the warning: {', '.join(warned)}" if warned else ""))
        return "\n".join(out)

    def table(self, threads: bool = True) -> str:
        """The rows as a fixed-width text table (the CLI's output): header, rows, summary."""
        head = ["check", "verdict", "measured", "tolerance", "reproduce"] + (["thread"] if threads else [])
        body = [[r.name, r.verdict, _num(r.measured), r.tolerance,
                 f"+exp={r.experiment}" if r.experiment else "-"] + ([r.thread or "-"] if threads else [])
                for r in self.checks]
        widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
        line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
        out = [self.header(), line(head), line(["-" * w for w in widths])]
        out += [line(b) for b in body]
        out.append(self.summary())
        return "\n".join(out)

    def details(self) -> str:
        """Each row's detail, one line per check."""
        return "\n".join(f"- {r.name}: {r.detail}" for r in self.checks if r.detail)

    def assert_healthy(self, allow=(), allow_inconclusive=()):
        """Raise AssertionError with the table when a check failed (unless named in `allow`) or was
        inconclusive (unless named in `allow_inconclusive`, or that is True: any). Returns self."""
        bad = [r for r in self.failed if r.name not in allow]
        bad += [r for r in self.inconclusive if allow_inconclusive is not True and r.name not in allow_inconclusive]
        if bad:
            what = "a failure" if any(r.failed for r in bad) else "a check it could not perform"
            raise AssertionError(f"attention doctor found {what}:\n" + self.table() + "\n" + "\n".join(
                f"- {r.name}: {r.verdict}: {r.detail}" for r in bad))
        return self
