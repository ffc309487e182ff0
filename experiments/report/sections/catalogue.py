"""The catalogue: one row per experiment and signature check (measured value, threshold, the
control's value, reproduced, seeds), a verdict per seed where there are several, and one
figure per experiment (failure vs control curves, entropy, saturation gradient, heatmaps)."""
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from experiments.records import RunRecord, flatten
from experiments.report.figures import look_at, plot_experiment

NAME = "catalogue"
ORDER = 0
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


def slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", s).strip("_")


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
            out.append(Group(exp, f"{exp} (sweep of {len(variants)} configs)" if sweep else exp, members, sweep))
            continue
        flat = {v: flatten({k: c for k, c in members[0].config.items() if k != "seed"})
                for v, members in variants.items()}
        keys = sorted(k for k in set().union(*flat.values())
                      if len({repr(f.get(k)) for f in flat.values()}) > 1)
        for v in sorted(variants, key=lambda v: [repr(flat[v].get(k)) for k in keys]):
            label = ", ".join(f"{k}={flat[v].get(k)}" for k in keys)
            out.append(Group(exp, f"{exp} [{label}]", variants[v]))
    return out


def _reproduced(runs: list[RunRecord]) -> str:
    rep = [r.reproduced for r in runs]
    broken = any((r.verdict or {}).get("signature_broken") for r in runs)
    text = fmt(rep[0]) if len(rep) == 1 else f"{sum(rep)} of {len(rep)}"
    return text + (" (signature also holds on the control)" if broken else "")


def _status(runs: list[RunRecord]) -> str:
    c = Counter(r.status for r in runs)
    return ", ".join(f"{k} ×{n}" if len(runs) > 1 else k for k, n in sorted(c.items()))


def catalogue_table(runs_found: list[RunRecord]) -> str:
    rows = ["| experiment | claim | check | measured | threshold | control | status | reproduced | seeds |",
            "|---|---|---|---|---|---|---|---|---|"]
    n_rep = n_runs = n_exp_rep = n_sweeps = 0
    gs = groups(runs_found)
    for g in gs:
        runs = g.runs
        claim = runs[0].claim or ""
        seeds = ", ".join(str(s) for s in sorted({r.seed for r in runs}))
        reps = [r.reproduced for r in runs]
        first = [g.label, claim]
        tail = [_status(runs), _reproduced(runs), seeds]
        if g.is_sweep:  # a sweep's per-cell verdict is a measurement: not in the tally
            n_sweeps += 1
            rows.append("| " + " | ".join(map(_cell, first + ["see its section", "", "", ""] + tail)) + " |")
            continue
        n_rep, n_runs, n_exp_rep = n_rep + sum(reps), n_runs + len(reps), n_exp_rep + all(reps)
        checks = (runs[0].verdict or {}).get("checks") or []
        if not checks:
            rows.append("| " + " | ".join(map(_cell, first + ["(no checks)", "", "", ""] + tail)) + " |")
        for i, c in enumerate(checks):
            per_run = [next((x for x in (r.verdict or {}).get("checks", []) if x["name"] == c["name"]), None)
                       for r in runs]
            per_run = [x for x in per_run if x is not None]
            measured = spread([x.get("measured") for x in per_run])
            passed = sum(bool(x.get("passed")) for x in per_run)
            measured += (" ✓" if passed == len(per_run) else " ✗") if len(per_run) == 1 \
                else f" ({passed}/{len(per_run)} pass)"
            control = spread([x["control"] for x in per_run if "control" in x]) if "control" in c else "–"
            cells = (first if i == 0 else ["", ""]) + [c["name"], measured, c.get("expected", ""), control] + \
                (tail if i == 0 else ["", "", ""])
            rows.append("| " + " | ".join(map(_cell, cells)) + " |")
    swept = f" (and {n_sweeps} sweep(s), judged in their sections)" if n_sweeps else ""
    summary = (f"**Reproduced: {n_exp_rep} of {len(gs) - n_sweeps} experiments in every seed; "
               f"{n_rep} of {n_runs} runs{swept}.** measured: the run's value (mean ± sample std over seeds "
               "when several, with how many pass); control: the same check on the control run, which "
               "must not show the signature (ratio and plateau checks are 1 there by definition).")
    return "## Catalogue\n\n" + "\n".join(rows) + "\n\n" + summary + "\n"


def per_seed_table(runs_found: list[RunRecord]) -> str | None:
    multi = [g for g in groups(runs_found) if len({r.seed for r in g.runs}) > 1 and not g.is_sweep]
    if not multi:
        return None
    rows = ["| experiment | seed | status | reproduced | checks |", "|---|---|---|---|---|"]
    for g in multi:
        for s in sorted(g.runs, key=lambda r: r.seed or 0):
            v = s.verdict or {}
            checks = "; ".join(f"{c['name']}: {fmt(c.get('measured'))} {'✓' if c.get('passed') else '✗'}"
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
            controls.append((c.exp + (f" seed {c.seed}" if len(runs) > 1 else ""),
                             c.metrics_frame(), c.attn_weights() if not controls else None))
    file = f"{slug(label)}.png"
    plot_experiment(fig_dir / file, label, curves, controls,
                    loss_metric=loss_metric(first), chance=first.context.get("ln_V"))
    control = controls[0][0].split(" seed")[0] if controls else None
    vs = f" vs its control `{control}`" if controls else ""
    seed_note = f", seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 else ""
    return (f"### {label}\n\n{first.claim or ''}\n\n"
            f"![{label}](figures/{file})\n\n"
            f"*{look_at(first.config.get('exp') or {}, name, control, loss_metric(first))}*\n\n"
            f"{name}{vs}{seed_note}. Top: loss, attention entropy and mean |dL/dscores| over steps "
            f"(mean over layers). Bottom: the most focused head at the end, at step 0 and at the end.\n")


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
    if figs:
        out["figures"] = "## Per experiment\n"
        out.update(figs)
    return out


def render(runs: list[RunRecord], fig_dir: Path) -> str | None:
    b = blocks(runs, fig_dir)
    return "\n".join(b.values()) if b else None
