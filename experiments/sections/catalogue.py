"""The catalogue: one row per experiment and signature check (measured value, threshold, the
control's value, reproduced, seeds), a verdict per seed where there are several, and one
figure per experiment (failure vs control curves, entropy, saturation gradient, heatmaps)."""
import math
import re
from collections import Counter
from pathlib import Path

from experiments.figures import plot_experiment
from experiments.io import load_attn_weights
from experiments.sections import metrics

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


def groups(summaries: list[dict]) -> list[tuple[str, str, list[dict]]]:
    """(exp, label, runs) per experiment variant: a variant is one config, seeds aside. When one
    exp name was run with a few different configs, the label names the keys that differ."""
    from experiments.report import flatten
    by_exp: dict[str, dict[str, list]] = {}
    for s in summaries:
        if s.get("role") != "control":
            by_exp.setdefault(s["exp"], {}).setdefault(s["_variant"], []).append(s)
    out = []
    for exp in sorted(by_exp):
        variants = by_exp[exp]
        if len(variants) == 1 or len(variants) > MAX_VARIANTS:
            runs = [s for v in sorted(variants) for s in variants[v]]
            out.append((exp, exp if len(variants) == 1 else f"{exp} (sweep of {len(variants)} configs)", runs))
            continue
        flat = {v: flatten({k: c for k, c in runs[0]["config"].items() if k != "seed"})
                for v, runs in variants.items()}
        keys = sorted(k for k in set().union(*flat.values())
                      if len({json_key(f.get(k)) for f in flat.values()}) > 1)
        for v in sorted(variants, key=lambda v: [json_key(flat[v].get(k)) for k in keys]):
            label = ", ".join(f"{k}={flat[v].get(k)}" for k in keys)
            out.append((exp, f"{exp} [{label}]", variants[v]))
    return out


def json_key(x) -> str:
    return repr(x)


def _reproduced(runs: list[dict]) -> str:
    rep = [bool((s.get("verdict") or {}).get("reproduced")) for s in runs]
    broken = any((s.get("verdict") or {}).get("signature_broken") for s in runs)
    text = fmt(rep[0]) if len(rep) == 1 else f"{sum(rep)} of {len(rep)}"
    return text + (" (signature also holds on the control)" if broken else "")


def _status(runs: list[dict]) -> str:
    c = Counter(s.get("status", "?") for s in runs)
    return ", ".join(f"{k} ×{n}" if len(runs) > 1 else k for k, n in sorted(c.items()))


def catalogue_table(summaries: list[dict]) -> str:
    rows = ["| experiment | claim | check | measured | threshold | control | status | reproduced | seeds |",
            "|---|---|---|---|---|---|---|---|---|"]
    n_rep = n_runs = n_exp_rep = n_sweeps = 0
    gs = groups(summaries)
    for exp, label, runs in gs:
        claim = runs[0].get("claim") or ""
        seeds = ", ".join(str(s) for s in sorted({s.get("seed") for s in runs}))
        reps = [bool((s.get("verdict") or {}).get("reproduced")) for s in runs]
        first = [label, claim]
        tail = [_status(runs), _reproduced(runs), seeds]
        if "sweep of" in label:  # a sweep's per-cell verdict is a measurement: not in the tally
            n_sweeps += 1
            rows.append("| " + " | ".join(map(_cell, first + ["see its section", "", "", ""] + tail)) + " |")
            continue
        n_rep, n_runs, n_exp_rep = n_rep + sum(reps), n_runs + len(reps), n_exp_rep + all(reps)
        checks = (runs[0].get("verdict") or {}).get("checks") or []
        if not checks:
            rows.append("| " + " | ".join(map(_cell, first + ["(no checks)", "", "", ""] + tail)) + " |")
        for i, c in enumerate(checks):
            per_run = [next((x for x in (s.get("verdict") or {}).get("checks", []) if x["name"] == c["name"]), None)
                       for s in runs]
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


def per_seed_table(summaries: list[dict]) -> str | None:
    multi = [(exp, label, runs) for exp, label, runs in groups(summaries)
             if len({s.get("seed") for s in runs}) > 1 and "sweep of" not in label]
    if not multi:
        return None
    rows = ["| experiment | seed | status | reproduced | checks |", "|---|---|---|---|---|"]
    for _, label, runs in multi:
        for s in sorted(runs, key=lambda s: s.get("seed", 0)):
            v = s.get("verdict") or {}
            checks = "; ".join(f"{c['name']}: {fmt(c.get('measured'))} {'✓' if c.get('passed') else '✗'}"
                               for c in v.get("checks", []))
            rows.append("| " + " | ".join(map(_cell, [label, s.get("seed"), s.get("status"),
                                                      fmt(bool(v.get("reproduced"))), checks])) + " |")
    return "## Verdict per seed\n\n" + "\n".join(rows) + "\n"


def _attn(s: dict | None):
    p = Path(s["_dir"]) / "attn_weights.npz" if s else None
    if p is None or not p.exists():
        return None
    try:
        return load_attn_weights(p)
    except Exception:
        return None


def figure(label: str, runs: list[dict], fig_dir: Path) -> str:
    runs = sorted(runs, key=lambda s: s.get("seed", 0))
    first = runs[0]
    cfg_exp = (first.get("config") or {}).get("exp") or {}
    seeds = [s.get("seed") for s in runs]
    name = first["exp"]
    curves = [(f"{name} seed {s.get('seed')}" if len(runs) > 1 else name, metrics(s), _attn(s) if i == 0 else None)
              for i, s in enumerate(runs)]
    controls, seen = [], set()
    for s in runs:
        c = s.get("_control")
        if c is not None and str(c["_dir"]) not in seen:
            seen.add(str(c["_dir"]))
            controls.append((c["exp"] + (f" seed {c.get('seed')}" if len(runs) > 1 else ""),
                             metrics(c), _attn(c) if not controls else None))
    file = f"{slug(label)}.png"
    plot_experiment(fig_dir / file, label, curves, controls,
                    loss_metric=cfg_exp.get("loss_metric", "loss/copy"),
                    chance=(first.get("context") or {}).get("ln_V"))
    vs = f" vs its control `{controls[0][0].split(' seed')[0]}`" if controls else ""
    seed_note = f", seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 else ""
    return (f"### {label}\n\n{first.get('claim') or ''}\n\n"
            f"![{label}](figures/{file})\n\n"
            f"*{name}{vs}{seed_note}. Top: loss, attention entropy and mean |dL/dscores| over steps "
            f"(mean over layers). Bottom: the most focused head at the end, at step 0 and at the end.*\n")


def blocks(summaries: list[dict], fig_dir: Path) -> dict[str, str]:
    out = {"catalogue": catalogue_table(summaries)}
    per_seed = per_seed_table(summaries)
    if per_seed:
        out["per_seed"] = per_seed
    figs = {}
    for exp, label, runs in groups(summaries):
        if "sweep of" not in label:
            figs[f"figure:{slug(label)}"] = figure(label, runs, fig_dir)
    if figs:
        out["figures"] = "## Per experiment\n"
        out.update(figs)
    return out


def render(summaries: list[dict], fig_dir: Path) -> str | None:
    b = blocks(summaries, fig_dir)
    return "\n".join(b.values()) if b else None
