"""Seeds nobody chose: the thin-margin experiments (the catalogue's `margin < 2` or `k < n`, and
the baseline) at seeds no threshold was set on (facts.UNSEEN_SEEDS; the reference's part
seeds_5_9). Per experiment its rate there, and per gating check its value at each of those seeds,
their mean and spread, its threshold, and its margin (report.seeds) over those seeds and over every
seed the report has."""
import math
import statistics
from pathlib import Path

from experiments.facts import THIN_MARGIN_EXPS, UNSEEN_SEEDS
from experiments.records import RunRecord
from experiments.report.seeds import Rate, checks_over_seeds, fmt_margin

NAME = "unseen_seeds"
TITLE = "## Seeds nobody chose: the thin-margin experiments at unseen seeds"   # refresh() places sections by it


def _num(x) -> str:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return "–" if x is None else str(x)
    return f"{x:.3g}" if math.isfinite(x) else str(x)


def _spread(values: list) -> str:
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    if len(nums) < 2:
        return "–"
    return f"{statistics.fmean(nums):.3g} ± {statistics.stdev(nums):.2g}"


def render(runs: list[RunRecord], fig_dir: Path) -> str | None:
    primary = [r for r in runs if not r.is_control and r.exp in THIN_MARGIN_EXPS and r.verdict]
    unseen = [r for r in primary if r.seed in UNSEEN_SEEDS]
    if not unseen:
        return None
    seeds = sorted({r.seed for r in unseen})
    rows = ["| experiment | check | " + " | ".join(f"seed {s}" for s in seeds)
            + " | mean ± std | threshold | margin (these seeds) | margin (all seeds: n) |",
            "|---|---|" + "---|" * len(seeds) + "---|---|---|---|"]
    rates = []
    for exp in THIN_MARGIN_EXPS:
        mine = sorted((r for r in unseen if r.exp == exp), key=lambda r: r.seed)
        if not mine:
            continue
        every = sorted((r for r in primary if r.exp == exp), key=lambda r: r.seed or 0)
        rate, rate_all = Rate.of(mine), Rate.of(every)
        rates.append(f"{exp} {rate.k} of {rate.n}" + (f" ({rate_all.k} of {rate_all.n} over seeds "
                                                     f"{', '.join(str(r.seed) for r in every)})" if len(every) > len(mine) else ""))
        over_all = {c.name: c for c in checks_over_seeds(every)}
        for c in checks_over_seeds(mine):
            if not c.gate or c.expected.startswith("=="):
                continue
            by_seed = dict(zip([r.seed for r in mine], c.measured))
            cells = " | ".join(_num(by_seed.get(s)) + ("" if p else " **FAIL**")
                               for s, p in zip(seeds, [dict(zip([r.seed for r in mine], c.passed)).get(s, True)
                                                       for s in seeds]))
            a = over_all.get(c.name)
            rows.append(f"| {exp} | {c.name} | {cells} | {_spread(c.measured)} | {c.expected} | {fmt_margin(c.margin)} "
                        f"| {fmt_margin(a.margin) if a else 'n/a'} (n={len(a.measured) if a else 0}) |")
    return "\n".join([
        TITLE, "",
        f"Seeds {', '.join(map(str, seeds))}, which no committed threshold was set on, for the experiments whose "
        "worst gating margin in the catalogue was under 2 spreads or which failed a seed (and the baseline, the "
        "first command's run): `python -m experiments.reference --parts seeds_5_9`. Reproduced at these seeds: "
        + "; ".join(rates) + ". Each gating check's value per seed, their mean and sample standard deviation, the "
        "threshold, and the margin (the worst seed's distance from the threshold in standard deviations) over these "
        "seeds and over every seed of the report (n).", "", *rows, ""])
