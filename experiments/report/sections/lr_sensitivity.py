"""Wortsman et al. 2023's Figure 1, small (`-m +exp=lr_sensitivity`): final loss/copy against the
learning rate, one curve per width, without and with qk-layernorm, and each curve's LR
sensitivity: the mean over the lr grid of min(final loss, loss at init) minus the best final loss
(a run that diverged counts as the loss at init). The blow-up lr of a curve is the first lr above
its best one whose final loss exceeds a level; the paper's shape is a blow-up lr that falls as
the width grows without qk-layernorm, and a wider stable range with it."""
import math
from collections import defaultdict
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.records import RunRecord  # noqa: E402
from experiments.report.figures import save
from experiments.report.runs import sweep_runs  # noqa: E402

NAME = "lr_sensitivity"
EXP = "lr_sensitivity"
METRIC = "loss/copy"
LEVELS = (0.1, 0.5)  # blow-up levels, as fractions of ln V (0.1 ln V: the copy not learned)
FIXES = {False: "no fix", True: "qk-layernorm"}


def lr_sensitivity(finals: dict[float, float], init: float) -> float:
    """Mean over the lr grid of min(final, init) minus the best final loss; NaN finals (diverged)
    count as the loss at init."""
    capped = [init if math.isnan(f) else min(f, init) for f in finals.values()]
    return float(np.mean(capped) - min(capped))


def blowup_lr(finals: dict[float, float], level: float) -> float | None:
    """The first lr above the best one whose final loss exceeds `level` (NaN: diverged, exceeds);
    None when every lr above the best stays at or below it."""
    lrs = sorted(finals)
    ok = [lr for lr in lrs if not math.isnan(finals[lr])]
    if not ok:
        return lrs[0] if lrs else None
    best = min(ok, key=lambda lr: finals[lr])
    return next((lr for lr in lrs if lr > best and not finals[lr] <= level), None)


def point(run: RunRecord) -> dict:
    cfg = run.config
    rows = run.metrics()
    first = next((r for r in rows if r.get("step") == 0 and r.get(METRIC) is not None), {})
    m = cfg["model"]
    return {"fix": FIXES[bool(m["attention"]["qk_norm"])], "width": m["d_model"],
            "d_k": m["attention"]["d_k"] or m["d_model"] // m["n_heads"], "lr": float(cfg["optim"]["lr"]),
            "final": run.final.get(METRIC, math.nan) if run.status == "completed" else math.nan,
            "init": first.get(METRIC, math.nan), "seed": run.seed,
            "max_logit": max((r.get("attn/max_score/L0") or 0 for r in rows), default=math.nan),
            "ln_V": run.context.get("ln_V") or math.log(cfg["data"]["vocab_size"])}


def curves(points: list[dict]) -> dict[tuple, dict]:
    """{(fix, width): {"finals": {lr: mean final over seeds}, "init", "d_k", "seeds", "max_logit"}}."""
    by = defaultdict(lambda: defaultdict(list))
    for p in points:
        by[(p["fix"], p["width"])][p["lr"]].append(p)
    out = {}
    for key, per_lr in sorted(by.items(), key=lambda kv: (kv[0][0] != "no fix", kv[0][1])):
        ps = [p for v in per_lr.values() for p in v]
        out[key] = {"finals": {lr: float(np.mean([p["final"] for p in v])) for lr, v in sorted(per_lr.items())},
                    "init": float(np.nanmean([p["init"] for p in ps])), "d_k": ps[0]["d_k"],
                    "seeds": len({p["seed"] for p in ps}), "ln_V": ps[0]["ln_V"],
                    "max_logit": {lr: float(np.max([p["max_logit"] for p in v])) for lr, v in sorted(per_lr.items())}}
    return out


def shape(cs: dict) -> list[str]:
    """The verdict lines: does the blow-up lr fall with width without the fix, and does the fix
    widen the stable range (a later blow-up and a lower LR sensitivity at every width)?"""
    lines = []
    widths = sorted({w for _, w in cs})
    for frac in LEVELS:
        level = frac * next(iter(cs.values()))["ln_V"]
        b = {k: blowup_lr(c["finals"], level) for k, c in cs.items()}
        show = lambda x: "none in grid" if x is None else f"{x:g}"  # noqa: E731
        inf = lambda x: math.inf if x is None else x  # noqa: E731
        nofix = [inf(b.get(("no fix", w))) for w in widths if ("no fix", w) in b]
        falls = len(nofix) >= 2 and all(a >= c for a, c in zip(nofix, nofix[1:])) and nofix[-1] < nofix[0]
        wider = all(inf(b.get(("qk-layernorm", w))) > inf(b.get(("no fix", w))) for w in widths
                    if ("qk-layernorm", w) in b and ("no fix", w) in b)
        per = "; ".join(f"{fix} " + ", ".join(f"d_model {w}: {show(b[(fix, w)])}" for w in widths if (fix, w) in b)
                        for fix in FIXES.values() if any(k[0] == fix for k in b))
        lines.append(f"- blow-up lr (first lr above the best whose final loss/copy > {frac:g} ln V = {level:.2f}): "
                     f"{per}. Falls with width without the fix: **{'yes' if falls else 'no'}**; "
                     f"qk-layernorm blows up later at every width: **{'yes' if wider else 'no'}**.")
    sens = {k: lr_sensitivity(c["finals"], c["init"]) for k, c in cs.items()}
    lower = all(sens[("qk-layernorm", w)] < sens[("no fix", w)] for w in widths
                if ("qk-layernorm", w) in sens and ("no fix", w) in sens)
    lines.append(f"- LR sensitivity lower with qk-layernorm at every width: **{'yes' if lower else 'no'}**.")
    return lines


def _figure(cs: dict, path: Path):
    fixes = [f for f in FIXES.values() if any(k[0] == f for k in cs)]
    fig, axes = plt.subplots(1, len(fixes), figsize=(4.2 * len(fixes), 3.4), sharey=True, squeeze=False,
                             layout="constrained")
    widths = sorted({w for _, w in cs})
    colours = dict(zip(widths, plt.cm.viridis(np.linspace(0.1, 0.85, len(widths)))))
    for ax, fix in zip(axes[0], fixes):
        for w in widths:
            c = cs.get((fix, w))
            if c is None:
                continue
            lrs = list(c["finals"])
            ys = [c["init"] if math.isnan(y) else y for y in c["finals"].values()]
            ax.plot(lrs, ys, marker="o", color=colours[w], label=f"d_model {w} (d_k {c['d_k']})")
        init = np.mean([c["init"] for c in cs.values()])
        ax.axhline(init, color="grey", ls=":", lw=0.8, label="loss at init")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("learning rate")
        ax.set_title(fix, fontsize=10)
    axes[0][0].set_ylabel("final loss/copy (nats)")
    axes[0][-1].legend(fontsize=7)
    save(fig, path)


def render(runs: list[RunRecord], fig_dir: Path) -> str | None:
    runs = sweep_runs(runs, EXP, fig_dir)
    if not runs:
        return None
    fig_dir = Path(fig_dir)
    cs = curves([point(r) for r in runs])
    _figure(cs, fig_dir / "lr_sensitivity.png")
    steps = max(r.config["train"]["steps"] for r in runs)
    lines = ["## Learning-rate sensitivity, with and without qk-layernorm (lr_sensitivity)", "",
             f"{len(runs)} runs, {steps} steps each, on the copy task; Wortsman et al. 2023 (arXiv 2309.14322) "
             "Figure 1, small. LR sensitivity: the mean over the lr grid of min(final loss, loss at init) "
             "minus the best final loss (lower: less sensitive).", "", *shape(cs), "",
             "![lr sensitivity](figures/lr_sensitivity.png)", "",
             "*Look at: where each curve leaves the bottom; without qk-layernorm the widest model should "
             "leave it first, with qk-layernorm every curve later.*", "",
             "| fix | d_model | d_k | LR sensitivity | best final loss/copy (lr) | "
             + " | ".join(f"blow-up lr (> {f:g} ln V)" for f in LEVELS) + " | max attention logit at the largest lr | seeds |",
             "|---|---|---|---|---|" + "---|" * len(LEVELS) + "---|---|"]
    for (fix, w), c in cs.items():
        f = c["finals"]
        ok = {lr: v for lr, v in f.items() if not math.isnan(v)}
        best = min(ok, key=ok.get) if ok else None
        blow = " | ".join(str(blowup_lr(f, frac * c["ln_V"]) or "–") for frac in LEVELS)
        best_s = f"{ok[best]:.3g} ({best:g})" if best is not None else "–"
        lines.append(f"| {fix} | {w} | {c['d_k']} | {lr_sensitivity(f, c['init']):.3f} | {best_s} | {blow} "
                     f"| {c['max_logit'][max(f)]:.3g} | {c['seeds']} |")
    return "\n".join(lines)
