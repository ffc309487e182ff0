"""What holds across seeds: how often an experiment reproduced (k of n, with a Wilson interval for
the rate), how often its signature held on the control, and each check's spread and margin.

margin = (distance of the worst seed from the threshold, on the passing side) / (sample std over
seeds): how many spreads a new seed may move before it crosses. With a normal spread, a check whose
margin is m fails at a new seed with probability at most Phi(-m): ~2% at m = 2.
"""
import math
import re
from dataclasses import dataclass

from experiments.records import RunRecord

Z95 = 1.959963984540054   # the two-sided 95% normal quantile
SMALL_MARGIN = 2.0        # the flag rule: a gating check whose margin is below this is fragile ...
MIN_SEEDS = 3             # ... and fewer seeds than this estimate no spread at all
RULE = (f"flags: `k < n` when some seed did not reproduce; `margin < {SMALL_MARGIN:g}` when a gating "
        f"check's worst seed lies within {SMALL_MARGIN:g} standard deviations over seeds of its threshold "
        f"(with a normal spread a new seed would cross it with probability above ~2%); `n < {MIN_SEEDS}` "
        f"when fewer than {MIN_SEEDS} seeds were run, too few to estimate a spread; `control` when the "
        "signature also held on the control in some seed.")

_THRESHOLD = re.compile(r"(<=|>=|<|>) (\S+)$")


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for a rate of k successes in n trials (95% by default)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


def threshold(expected: str) -> tuple[str, float] | None:
    """(op, value) of a verdict's `expected` text (">= 300", "rel. error to x <= 0.1"); None for
    status checks ("== error") and report-only measurements ("reported")."""
    m = _THRESHOLD.search(str(expected or ""))
    if not m:
        return None
    try:
        return m.group(1), float(m.group(2))
    except ValueError:
        return None


def held_to(c: dict) -> tuple[str, float] | None:
    """(op, threshold) of a verdict's check: its own fields, or parsed from `expected` (records
    written before the verdict had them)."""
    if c.get("op") in ("<=", ">=", "<", ">") and _number(c.get("threshold")) is not None:
        return c["op"], float(c["threshold"])
    return threshold(c.get("expected"))


def same_check(a: dict, b: dict) -> bool:
    """One check in two runs' verdicts: by key where both have one, else by name."""
    return a["key"] == b["key"] if "key" in a and "key" in b else a["name"] == b["name"]


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def margin(values: list, op: str, limit: float, all_pass: bool) -> float | None:
    """Distance of the worst value from `limit` (positive on the passing side) in sample stds over
    the values; inf (or -inf when they fail) when all agree exactly; None with fewer than two
    values or any that is not a finite number."""
    nums = [_number(v) for v in values]
    if len(nums) < 2 or any(v is None for v in nums):
        return None
    worst = min((v - limit) if op in (">=", ">") else (limit - v) for v in nums)
    mean = sum(nums) / len(nums)
    sd = math.sqrt(sum((v - mean) ** 2 for v in nums) / (len(nums) - 1))
    if sd == 0:
        return math.inf if all_pass else -math.inf
    return worst / sd


@dataclass
class CheckOverSeeds:
    """One check of one experiment, over its seeds."""
    name: str
    gate: bool                 # part of the signature (not report_only)
    measured: list             # per seed, in seed order
    control: list              # per seed where the control was measured
    passed: list[bool]
    expected: str
    margin: float | None       # None: n/a (status check, report_only, one seed, a non-number)

    @property
    def n_pass(self) -> int:
        return sum(self.passed)

    @property
    def small(self) -> bool:
        return self.gate and self.margin is not None and self.margin < SMALL_MARGIN

    def flags(self) -> list[str]:
        out = []
        if self.gate and self.n_pass < len(self.passed):
            out.append(f"fails in {len(self.passed) - self.n_pass} of {len(self.passed)}")
        if self.small:
            out.append(f"margin < {SMALL_MARGIN:g}")
        return out


def checks_over_seeds(runs: list[RunRecord]) -> list[CheckOverSeeds]:
    """Every check of the first run's verdict, measured in every run (seed order) that has it."""
    runs = sorted(runs, key=lambda r: r.seed or 0)
    first = next((r.verdict["checks"] for r in runs if (r.verdict or {}).get("checks")), [])
    out = []
    for c in first:
        per_run = [next((x for x in (r.verdict or {}).get("checks", []) if same_check(x, c)), None)
                   for r in runs]
        per_run = [x for x in per_run if x is not None]
        gate = not c.get("report_only", False)
        passed = [bool(x.get("passed")) for x in per_run]
        measured = [x.get("measured") for x in per_run]
        t = held_to(c) if gate and c.get("kind") != "status" else None
        m = margin(measured, t[0], t[1], all(passed)) if t else None
        out.append(CheckOverSeeds(c["name"], gate, measured, [x["control"] for x in per_run if "control" in x],
                                  passed, c.get("expected", ""), m))
    return out


@dataclass
class Rate:
    """How often one experiment reproduced over its seeds, and how often its control showed the signature."""
    k: int
    n: int
    control_k: int | None      # seeds whose control satisfied the signature; None: no control
    control_n: int

    @classmethod
    def of(cls, runs: list[RunRecord]) -> "Rate":
        broken = [(r.verdict or {}).get("signature_broken") for r in runs]
        judged = [b for b in broken if b is not None]
        return cls(sum(r.reproduced for r in runs), len(runs),
                   sum(map(bool, judged)) if judged else None, len(judged))

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.k, self.n)

    def interval_text(self) -> str:
        lo, hi = self.interval
        return f"{lo:.2f}–{hi:.2f}"

    def control_text(self) -> str:
        return "no control" if self.control_k is None else f"control {self.control_k} of {self.control_n}"


def fmt_margin(m: float | None) -> str:
    if m is None:
        return "n/a"
    if math.isinf(m):
        return "inf" if m > 0 else "-inf"
    return f"{m:.2f}" if abs(m) < 10 else f"{m:.0f}" if abs(m) < 1e4 else f"{m:.1e}"
