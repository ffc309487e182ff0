"""A doctor's result: one row per check, printed as a table, written as JSON, asserted in a test."""
import json
import math
from dataclasses import asdict, dataclass, field

VERDICTS = ("pass", "fail", "warn")  # or "skip: <why>"


@dataclass
class Row:
    """One check's outcome. measured: the number judged (None when skipped); tolerance: how it was
    judged, e.g. "<= 1e-06"; experiment: the catalogue's `python run.py +exp=NAME` that reproduces
    the failure this check looks for; thread: the public issue where it was shipped."""
    name: str
    verdict: str
    measured: float | None = None
    tolerance: str = ""
    experiment: str = ""
    thread: str = ""
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict == "fail"

    @property
    def skipped(self) -> bool:
        return self.verdict.startswith("skip")


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
    target: str
    checks: list[Row] = field(default_factory=list)
    info: dict = field(default_factory=dict)   # what the doctor found out: kind, causal, paths, timings

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.checks if r.failed]

    @property
    def ok(self) -> bool:
        return not self.failed

    def __getitem__(self, name: str) -> Row:
        for r in self.checks:
            if r.name == name:
                return r
        raise KeyError(name)

    def verdicts(self) -> dict[str, str]:
        return {r.name: r.verdict for r in self.checks}

    def to_dict(self) -> dict:
        rows = [{k: _json_num(v) for k, v in asdict(r).items()} for r in self.checks]
        return {"target": self.target, "checks": rows, "info": self.info}

    def to_json(self, path=None) -> str:
        text = json.dumps(self.to_dict(), indent=1) + "\n"
        if path is not None:
            with open(path, "w") as f:
                f.write(text)
        return text

    def table(self, threads: bool = True) -> str:
        """The rows as a fixed-width text table (the CLI's output)."""
        head = ["check", "verdict", "measured", "tolerance", "reproduce"] + (["thread"] if threads else [])
        body = [[r.name, r.verdict, _num(r.measured), r.tolerance,
                 f"+exp={r.experiment}" if r.experiment else "-"] + ([r.thread or "-"] if threads else [])
                for r in self.checks]
        widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
        line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
        out = [f"attention doctor: {self.target}", line(head), line(["-" * w for w in widths])]
        out += [line(b) for b in body]
        failed = self.failed
        out.append(f"{len(failed)} failed: {', '.join(r.name for r in failed)}" if failed else "nothing failed")
        return "\n".join(out)

    def details(self) -> str:
        return "\n".join(f"- {r.name}: {r.detail}" for r in self.checks if r.detail)

    def assert_healthy(self, allow: tuple[str, ...] = ()):
        """Raise AssertionError with the table when a check (not in `allow`) failed."""
        bad = [r for r in self.failed if r.name not in allow]
        if bad:
            raise AssertionError("attention doctor found a failure:\n" + self.table() + "\n" + "\n".join(
                f"- {r.name}: {r.detail}" for r in bad))
        return self
