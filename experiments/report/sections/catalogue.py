"""The catalogue: one row per experiment (k of n seeds reproduced with a 95% interval, how often
the control showed the signature, the worst check margin, flags), a verdict per seed where there
are several, and per experiment a figure (failure vs control curves, entropy, saturation
gradient, heatmaps) and every check's spread over seeds (report.seeds)."""
import hashlib
import math
import re
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from experiments.layout import CURVES, SUMMARY
from experiments.records import RunRecord, flatten
from experiments.report.figures import look_at, plot_experiment
from experiments.report.runs import control_name
from experiments.report.seeds import MIN_SEEDS, RULE, SMALL_MARGIN, CheckOverSeeds, Rate, checks_over_seeds, fmt_margin

NAME = "catalogue"
MAX_VARIANTS = 3  # more configs than this under one exp name is a sweep: one row, its own section


def fmt(x) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int, float)):
        x = float(x)
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        if x == 0:
            return "0"
        if abs(x) >= 1e4 or abs(x) < 1e-3:
            return f"{x:.2e}"
        return f"{x:.4g}"
    return str(x)


def spread(values: list) -> str:
    """One value as is; several as mean ± sample std (numbers) or the distinct values."""
    if not values:
        return "–"
    if len(values) == 1:
        return fmt(values[0])
    nums = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(nums) != len(values):
        return ", ".join(f"{v} ×{n}" if n > 1 else str(v) for v, n in sorted(Counter(map(fmt, values)).items()))
    finite = [v for v in nums if math.isfinite(v)]
    if len(finite) < len(nums):
        return ", ".join(fmt(v) for v in nums)
    mean = sum(finite) / len(finite)
    sd = math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1))
    return f"{fmt(mean)} ± {sd:.2g}"


def _cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def slug(s: str, limit: int = 96) -> str:
    """A file-name-safe label; a long one (variants that differ in many keys) is cut and keeps a
    hash of the whole, so it stays unique and under the file system's name limit."""
    out = re.sub(r"[^A-Za-z0-9_.=-]+", "_", s).strip("_")
    if len(out) <= limit:
        return out
    return f"{out[:limit - 13]}_{hashlib.sha1(s.encode()).hexdigest()[:12]}"


@dataclass
class Group:
    """The runs of one experiment variant (one config, seeds aside), or of a whole sweep."""
    exp: str
    label: str
    runs: list[RunRecord]
    is_sweep: bool = False   # more configs than MAX_VARIANTS: one row here, judged in its own section


def groups(runs: list[RunRecord]) -> list[Group]:
    """One group per experiment variant. When one exp name was run with a few different configs,
    the label names the keys that differ."""
    by_exp: dict[str, dict[str, list]] = {}
    for r in runs:
        if not r.is_control:
            by_exp.setdefault(r.exp, {}).setdefault(r.variant, []).append(r)
    out = []
    for exp in sorted(by_exp):
        variants = by_exp[exp]
        if len(variants) == 1 or len(variants) > MAX_VARIANTS:
            members = [r for v in sorted(variants) for r in variants[v]]
            sweep = len(variants) > 1
            given = ", ".join(common_overrides(members))
            label = f"{exp} (sweep of {len(variants)} configs)" if sweep else f"{exp} [{given}]" if given else exp
            out.append(Group(exp, label, members, sweep))
            continue
        flat = {v: flatten({k: c for k, c in members[0].config.items() if k != "seed"})
                for v, members in variants.items()}
        keys = sorted(k for k in set().union(*flat.values())
                      if len({repr(f.get(k)) for f in flat.values()}) > 1)
        for v in sorted(variants, key=lambda v: [repr(flat[v].get(k)) for k in keys]):
            named = [f"{k}={flat[v].get(k)}" for k in keys]
            given = [o for o in common_overrides(variants[v]) if o.split("=")[0] not in keys]
            out.append(Group(exp, f"{exp} [{', '.join(named + given)}]", variants[v]))
    return out


def common_overrides(runs: list[RunRecord]) -> list[str]:
    """The overrides every one of these runs was given, in the first one's order."""
    sets = [r.given_overrides() for r in runs]
    return [o for o in sets[0] if all(o in s for s in sets[1:])] if sets else []


def _status(runs: list[RunRecord]) -> str:
    c = Counter(r.status for r in runs)
    return ", ".join(f"{k} ×{n}" if len(runs) > 1 else k for k, n in sorted(c.items()))


def _seeds(runs: list[RunRecord]) -> str:
    return ", ".join(str(s) for s in sorted({r.seed for r in runs}, key=lambda s: (s is None, s or 0)))


def _row(cells) -> str:
    return "| " + " | ".join(map(_cell, cells)) + " |"


def flags(rate: Rate, checks: list[CheckOverSeeds]) -> list[str]:
    """The experiment's flags (seeds.RULE states them)."""
    out = []
    if rate.k < rate.n:
        out.append("k < n")
    small = [c for c in checks if c.small]
    if small:
        out.append(f"margin < {SMALL_MARGIN:g}" + (f" ({len(small)} checks)" if len(small) > 1 else ""))
    if rate.n < MIN_SEEDS:
        out.append(f"n < {MIN_SEEDS}")
    if rate.control_k:
        out.append("control")
    return out


def worst_margin(checks: list[CheckOverSeeds], n: int) -> str:
    """The smallest margin of the gating checks, and whose it is."""
    scored = [c for c in checks if c.gate and c.margin is not None]
    if not scored:
        return "n/a (1 seed)" if n < 2 and any(c.gate for c in checks) else "n/a"
    c = min(scored, key=lambda c: c.margin)
    return f"{fmt_margin(c.margin)} ({c.name})"


def _broken(g) -> str:
    """What the experiment breaks, in a few words: the run's own `exp.broken`."""
    return (g.runs[0].config.get("exp") or {}).get("broken") or ""


def anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation but - and _ dropped, spaces as -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def catalogue_table(runs_found: list[RunRecord]) -> str:
    rows = ["| experiment | what is broken | seeds | status | reproduced | 95% interval "
            "| control shows signature | worst margin | flags |",
            "|---|---|---|---|---|---|---|---|---|"]
    n_rep = n_runs = n_exp_rep = n_sweeps = 0
    gs = groups(runs_found)
    for g in gs:
        rate = Rate.of(g.runs)
        if g.is_sweep:  # a sweep's per-cell verdict is a measurement: not in the tally
            n_sweeps += 1
            rows.append(_row([g.label, _broken(g), _seeds(g.runs), _status(g.runs), f"{rate.k} of {rate.n} runs",
                              "–", "–", "see its section", ""]))
            continue
        n_rep, n_runs, n_exp_rep = n_rep + rate.k, n_runs + rate.n, n_exp_rep + (rate.k == rate.n)
        checks = checks_over_seeds(g.runs)
        control = "–" if rate.control_k is None else f"{rate.control_k} of {rate.control_n}"
        rows.append(_row([f"[{g.label}](#{anchor(g.label)})", _broken(g), _seeds(g.runs), _status(g.runs),
                          f"{rate.k} of {rate.n}",
                          rate.interval_text(), control,
                          worst_margin(checks, rate.n) if checks else "(no checks)",
                          ", ".join(flags(rate, checks))]))
    swept = f" (and {n_sweeps} sweep(s), judged in their sections)" if n_sweeps else ""
    summary = (f"**Reproduced: {n_exp_rep} of {len(gs) - n_sweeps} experiments in every seed; "
               f"{n_rep} of {n_runs} runs{swept}.** reproduced: k of n seeds, with the 95% Wilson "
               "interval for the rate; control shows signature: in how many seeds the control run "
               "satisfied the whole signature too (it must not); worst margin: the gating check whose "
               "worst seed lies closest to its threshold, in standard deviations over seeds (inf: all "
               "seeds agree exactly); each experiment's section below has every check's spread. "
               + RULE)
    return "## Catalogue\n\n" + "\n".join(rows) + "\n\n" + summary + "\n"


def rate_lines(runs_found: list[RunRecord]) -> list[str]:
    """One line per experiment: k of n seeds reproduced, and the control's rate (the end of a multirun)."""
    out = []
    for g in groups(runs_found):
        rate = Rate.of(g.runs)
        if g.is_sweep:
            out.append(f"{g.label}: {rate.k} of {rate.n} runs reproduced (a sweep: see its section)")
            continue
        fl = flags(rate, checks_over_seeds(g.runs))
        out.append(f"{g.label}: {rate.k} of {rate.n} seeds reproduced (95% interval {rate.interval_text()}); "
                   f"{rate.control_text()}" + (f" [{', '.join(fl)}]" if fl else ""))
    return out


def checks_table(g: Group) -> str:
    """One experiment's checks over its seeds: the detail behind its catalogue row."""
    rate, checks = Rate.of(g.runs), checks_over_seeds(g.runs)
    lead = (f"Seeds {_seeds(g.runs)}: reproduced in {rate.k} of {rate.n} "
            f"(95% interval {rate.interval_text()}); "
            + ("no control" if rate.control_k is None
               else f"the signature held on the control in {rate.control_k} of {rate.control_n}")
            + f"; status {_status(g.runs)}.")
    if not checks:
        return lead + "\n"
    rows = ["| check | passes | measured (mean ± std) | min..max | threshold | control | margin | flags |",
            "|---|---|---|---|---|---|---|---|"]
    for c in checks:
        nums = [float(v) for v in c.measured if isinstance(v, (int, float)) and not isinstance(v, bool)]
        span = f"{fmt(min(nums))}..{fmt(max(nums))}" if len(nums) == len(c.measured) and len(nums) > 1 else "–"
        threshold = c.expected if c.gate else f"{c.expected} (not gated)"
        rows.append(_row([c.name, f"{c.n_pass} of {len(c.passed)}", spread(c.measured), span, threshold,
                          spread(c.control) if c.control else "–",
                          fmt_margin(c.margin) if c.gate else "n/a", ", ".join(c.flags())]))
    return lead + "\n\n" + "\n".join(rows) + "\n"


def per_seed_table(runs_found: list[RunRecord]) -> str | None:
    multi = [g for g in groups(runs_found) if len({r.seed for r in g.runs}) > 1 and not g.is_sweep]
    if not multi:
        return None
    rows = ["| experiment | seed | status | reproduced | checks |", "|---|---|---|---|---|"]
    for g in multi:
        for s in sorted(g.runs, key=lambda r: r.seed or 0):
            v = s.verdict or {}
            checks = "; ".join((f"{c['name']}: not measurable on this data" if c.get("not_measurable") else
                                f"{c['name']}: {fmt(c.get('measured'))} {'✓' if c.get('passed') else '✗'}")
                               for c in v.get("checks", []))
            rows.append("| " + " | ".join(map(_cell, [g.label, s.seed, s.status,
                                                      fmt(bool(v.get("reproduced"))), checks])) + " |")
    return "## Verdict per seed\n\n" + "\n".join(rows) + "\n"


def figure(label: str, runs: list[RunRecord], fig_dir: Path) -> str:
    runs = sorted(runs, key=lambda r: r.seed or 0)
    first = runs[0]
    seeds = [r.seed for r in runs]
    name = first.exp
    curves = [(f"{name} seed {r.seed}" if len(runs) > 1 else name, r.metrics_frame(),
               r.attn_weights() if i == 0 else None) for i, r in enumerate(runs)]
    controls, seen = [], set()
    for r in runs:
        c = r.control_run
        if c is not None and str(c.dir) not in seen:
            seen.add(str(c.dir))
            controls.append((control_name(r) + (f" seed {c.seed}" if len(runs) > 1 else ""),
                             c.metrics_frame(), c.attn_weights() if not controls else None))
    file = f"{slug(label)}.png"
    own = first.dir / CURVES if first.dir else None
    if len(runs) == 1 and label == first.title() and own and own.is_file() and \
            own.stat().st_mtime >= (first.dir / SUMMARY).stat().st_mtime:
        # one run: the figure the run drew after its verdict (run.py, or the re-judge) is this one,
        # the same title, curves, heatmaps and verdict panel; drawing it again costs a second of CPU
        shutil.copyfile(own, fig_dir / file)
    else:
        plot_experiment(fig_dir / file, label, curves, controls,
                        loss_metric=loss_metric(first), chance=first.context.get("ln_V"),
                        third=(first.config.get("exp") or {}).get("figure_metric"),
                        verdicts=[(r.seed, r.verdict) for r in runs if r.verdict])
    control = controls[0][0].split(" seed")[0] if controls else None
    vs = f" vs its control `{control}`" if controls else ""
    seed_note = f", seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 else ""
    return (f"### {label}\n\n{first.claim or ''}\n\n"
            f"![{label}](figures/{file})\n\n"
            f"*{look_at(first.config.get('exp') or {}, name, control, loss_metric(first))}*\n\n"
            f"{name}{vs}{seed_note}. Top: loss, attention entropy and mean |dL/dscores| over steps "
            f"(mean over layers). Bottom: the most focused head at the end, at step 0 and at the end. "
            f"Right: the verdict, each check's value on the failure and its control per seed against its "
            f"threshold.\n")


def loss_metric(run: RunRecord) -> str:
    """The loss an experiment is judged on; summaries written before exp.loss_metric was a
    config key lack it, and their experiments all used loss/copy."""
    return (run.config.get("exp") or {}).get("loss_metric") or "loss/copy"


def blocks(runs: list[RunRecord], fig_dir: Path) -> dict[str, str]:
    out = {"catalogue": catalogue_table(runs)}
    per_seed = per_seed_table(runs)
    if per_seed:
        out["per_seed"] = per_seed
    figs = {}
    for g in groups(runs):
        if not g.is_sweep:
            figs[f"figure:{slug(g.label)}"] = figure(g.label, g.runs, fig_dir)
            figs[f"checks:{slug(g.label)}"] = checks_table(g)
    if figs:
        out["figures"] = "## Per experiment\n"
        out.update(figs)
    return out


def render(runs: list[RunRecord], fig_dir: Path) -> str | None:
    b = blocks(runs, fig_dir)
    return "\n".join(b.values()) if b else None
