"""Phase diagram of a missing 1/sqrt(d_k) (`-m +exp=phase_no_scaling`): for each cell of
d_k x q/k init scale x optimizer, scaled and unscaled, how long loss/copy sits on the chance
plateau (>= 0.9 ln V, capped at the budget) and where it ends, against the score std at init
that the variance argument predicts."""
import math
from collections import defaultdict
from pathlib import Path

import matplotlib
import matplotlib.cm
import matplotlib.colors
import matplotlib.patches
import matplotlib.ticker
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from attention.variance import predicted_score_std  # noqa: E402
from experiments.config import exp_check  # noqa: E402
from experiments.judging.expressions import evaluate as expr  # noqa: E402
from experiments.judging.verdict import RunView  # noqa: E402
from experiments.records import RunRecord  # noqa: E402
from experiments.report.figures import save
from experiments.report.runs import sweep_runs  # noqa: E402

NAME = "phase"
TITLE = "## When does a missing sqrt(d_k) flatline training? (phase_no_scaling)"  # refresh() places a new section before it
EXP = "phase_no_scaling"
# no_scaling's plateau check, applied to every cell: steps before its metric first drops below its
# level, and the ratio to the scaled twin at which the flatline holds
FLATLINE = exp_check("no_scaling", "plateau")
METRIC = FLATLINE["metric"]


def model_score_std(model: dict) -> float:
    """The variance argument's score std at init for a model config (attention.variance)."""
    att = model["attention"]
    d_k = att["d_k"] or model["d_model"] // model["n_heads"]
    return predicted_score_std(model["init"], model["d_model"], d_k, model["qk_gain"], att["scale"], att["score"])


def labels(cfg: dict) -> dict:
    m, o = cfg["model"], cfg["optim"]
    att, gain = m["attention"], m["qk_gain"]
    opt = o["name"] + (f" eps={o['eps']:g}" if o["name"] == "adamw" and o["eps"] != 1e-8 else "")  # 1e-8: conf/optim/adamw.yaml's
    scale = att["scale"]
    return {"d_k": att["d_k"] or m["d_model"] // m["n_heads"],
            "init": m["init"] + (f" x{gain:g}" if gain != 1 else ""),
            "optim": opt, "scale": {"sqrt_dk": "scaled", "none": "unscaled"}.get(scale, f"scale={scale}")}


def cell(run: RunRecord) -> dict:
    """One run's point of the diagram."""
    cfg = run.config
    rows = run.metrics()
    ctx = dict(run.context)
    ctx.setdefault("steps_done", run.steps_done)
    ln_v = ctx.get("ln_V") or math.log(cfg["data"]["vocab_size"])
    view = RunView(status=run.status, rows=rows, context=ctx)
    first = next((r for r in rows if r.get("step") == 0), {})
    return {**labels(cfg), "seed": run.seed, "status": run.status,
            "budget": cfg["train"]["steps"],
            "plateau": min(view.plateau_steps(METRIC, expr(FLATLINE["level"], {"ln_V": ln_v})), cfg["train"]["steps"]),
            "final": run.final.get(METRIC) if run.status == "completed" else math.nan,
            "pred_std": model_score_std(cfg["model"]),
            "init_std": first.get("attn/score_std/L0"), "ln_V": ln_v}


def aggregate(points: list[dict]) -> list[dict]:
    """Mean over seeds per cell; a cell is flat when every seed stayed on the plateau throughout."""
    groups = defaultdict(list)
    for p in points:
        groups[(p["optim"], p["scale"], p["init"], p["d_k"])].append(p)
    out = []
    for key, ps in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        mean = lambda k: float(np.nanmean([p[k] for p in ps])) if any(  # noqa: E731
            p[k] is not None and not math.isnan(p[k]) for p in ps) else math.nan
        out.append({**{k: ps[0][k] for k in ("optim", "scale", "init", "d_k", "pred_std", "budget")},
                    "plateau": mean("plateau"), "final": mean("final"),
                    "init_std": mean("init_std") if all(p["init_std"] is not None for p in ps) else math.nan,
                    "seeds": len(ps), "diverged": sum(p["status"] == "diverged" for p in ps),
                    "flat": all(p["plateau"] >= p["budget"] for p in ps)})
    return out


def _text_colour(rgba) -> str:
    """Black or white, whichever reads better on a cell of this colour (relative luminance)."""
    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgba[:3])
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.18 else "white"


def _cell_text(c: dict, value: str) -> str:
    """A cell's label: its value ("600+" where it stayed on the plateau the whole budget, i.e.
    capped) over its predicted score std."""
    v = c[value]
    if math.isnan(v):
        txt = "diverged" if c["diverged"] else "–"
    elif value == "plateau" and c["flat"]:
        txt = f"{c['budget']:.0f}+"
    else:
        txt = f"{v:.3g}"
    return f"{txt}\nσ≈{c['pred_std']:.2g}"


def _heatmaps(cells: list[dict], value: str, title: str, path: Path, vmax: float, cbar_label: str):
    """One panel per optimizer x scale, q/k init down and d_k across, a shared colour bar.
    Plateau cells capped at the budget are hatched; labels take black or white by cell colour."""
    optims = sorted({c["optim"] for c in cells})
    scales = sorted({c["scale"] for c in cells}, key=lambda s: s != "scaled")
    d_ks = sorted({c["d_k"] for c in cells})
    # inits ordered by the q/k scale they give (the variance argument's factor, d_k aside)
    order = {c["init"]: c["pred_std"] / math.sqrt(c["d_k"]) * (math.sqrt(c["d_k"]) if c["scale"] == "scaled" else 1)
             for c in cells}
    inits = sorted(order, key=lambda i: (order[i], i))
    fig, axes = plt.subplots(len(optims), len(scales), squeeze=False, layout="constrained",
                             figsize=(3.2 + 1.3 * len(d_ks) * len(scales), 1.2 + 0.75 * len(inits) * len(optims)))
    by = {(c["optim"], c["scale"], c["init"], c["d_k"]): c for c in cells}
    cmap = plt.get_cmap("viridis_r" if value == "final" else "magma_r")
    norm = matplotlib.colors.Normalize(vmin=0, vmax=vmax)
    for i, opt in enumerate(optims):
        for j, sc in enumerate(scales):
            ax = axes[i][j]
            grid = np.full((len(inits), len(d_ks)), np.nan)
            for a, init in enumerate(inits):
                for b, dk in enumerate(d_ks):
                    if (c := by.get((opt, sc, init, dk))) is not None:
                        grid[a, b] = c[value]
            ax.imshow(grid, cmap=cmap, norm=norm, aspect="auto")
            for a, init in enumerate(inits):
                for b, dk in enumerate(d_ks):
                    c = by.get((opt, sc, init, dk))
                    if c is None:
                        continue
                    nan = math.isnan(c[value])
                    if value == "plateau" and c["flat"]:
                        ax.add_patch(matplotlib.patches.Rectangle((b - 0.5, a - 0.5), 1, 1, fill=False, lw=0,
                                                                  hatch="///", edgecolor="0.55"))
                    colour = "black" if nan else _text_colour(cmap(norm(c[value])))
                    ax.text(b, a, _cell_text(c, value), ha="center", va="center", fontsize=7, color=colour,
                            bbox=dict(boxstyle="round,pad=0.15", fc="black", ec="none", alpha=0.6)
                            if colour == "white" and value == "plateau" and c["flat"] else None)
            ax.set_xticks(range(len(d_ks)), [str(d) for d in d_ks], fontsize=8)
            ax.set_yticks(range(len(inits)), inits, fontsize=8)
            ax.set_xlabel("d_k (head width)", fontsize=8)
            ax.set_ylabel("q/k init", fontsize=8)
            ax.set_title(f"{opt}, {sc}", fontsize=9)
    fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap), ax=axes.ravel().tolist(),
                 label=cbar_label, shrink=0.9)
    fig.suptitle(f"{title} (σ: predicted score std at init)", fontsize=10)
    save(fig, path)


def _scatter(points: list[dict], path: Path):
    """Plateau length per run against the predicted score std; a run still on the plateau at the
    end of its budget is drawn at the cap with an arrow up: its true plateau is longer."""
    fig, ax = plt.subplots(figsize=(7.6, 3.8), layout="constrained")
    optims = sorted({p["optim"] for p in points})
    colors = dict(zip(optims, plt.cm.tab10.colors))
    for p in sorted(points, key=lambda p: (p["optim"], p["scale"], p["init"], p["d_k"], str(p["seed"]))):
        capped = p["plateau"] >= p["budget"]
        ax.scatter(p["pred_std"], p["plateau"], color=colors[p["optim"]], s=18,
                   marker="o" if p["scale"] == "scaled" else "x")
        if capped:
            ax.annotate("", (p["pred_std"], p["plateau"] * 1.09), (p["pred_std"], p["plateau"]),
                        arrowprops=dict(arrowstyle="->", color=colors[p["optim"]], lw=1))
    budgets = sorted({p["budget"] for p in points})
    for b in budgets:
        ax.axhline(b, color="grey", lw=0.8, ls=":")
    for opt in optims:
        ax.scatter([], [], color=colors[opt], label=opt)
    ax.scatter([], [], marker="o", color="gray", label="scaled")
    ax.scatter([], [], marker="x", color="gray", label="unscaled")
    ax.plot([], [], ls=":", color="grey", label="budget (the cap)")
    ax.plot([], [], ls="", marker="$\\uparrow$", ms=9, color="gray",
            label="capped: still on the plateau\nat the end of the budget")
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1, 2, 5)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))  # 0.02, not 2x10^-2
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_ylim(0, max(budgets) * 1.15)
    ax.set_xlabel("predicted score std at init (logits; variance argument)")
    ax.set_ylabel("steps on the chance plateau (steps)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    save(fig, path)


def _fmt(x, spec=".3g"):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def pairs_table(cells: list[dict]) -> list[str]:
    """Unscaled against scaled at the same d_k, init and optimizer: the flatline holds where the
    unscaled cell stays on the plateau as many times as long as its scaled twin as no_scaling's
    plateau check asks, and that twin left it (a scaled cell stuck too means the init or
    optimizer, not the scale, is what stalls)."""
    by = {(c["optim"], c["init"], c["d_k"], c["scale"]): c for c in cells}
    out = ["Where the flatline holds: the unscaled cell against its scaled twin (same d_k, init, "
           f"optimizer). *holds*: unscaled plateau >= {FLATLINE['value']:g}x the scaled one (no_scaling's "
           "plateau check), scaled left the plateau; "
           "*confounded*: the scaled twin never left it either.", "",
           "| optimizer | q/k init | d_k | predicted std unscaled | plateau scaled | plateau unscaled "
           "| ratio | final loss/copy unscaled / scaled | flatline |",
           "|---|---|---|---|---|---|---|---|---|"]
    for (o, i, d, sc), u in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        s = by.get((o, i, d, "scaled"))
        if sc != "unscaled" or s is None:
            continue
        ratio = u["plateau"] / max(s["plateau"], 1)
        verdict = "confounded" if s["flat"] else ("holds" if ratio >= FLATLINE["value"] else "no")
        capped = lambda c: f"{c['plateau']:.0f}{'+' if c['flat'] else ''}"  # noqa: E731
        out.append(f"| {o} | {i} | {d} | {_fmt(u['pred_std'])} | {capped(s)} | {capped(u)} | {ratio:.1f} "
                   f"| {_fmt(u['final'])} / {_fmt(s['final'])} | {verdict} |")
    return out + [""]


def render(runs: list[RunRecord], fig_dir: Path) -> str | None:
    runs = sweep_runs(runs, EXP, fig_dir)
    if not runs:
        return None
    fig_dir = Path(fig_dir)
    points = [cell(s) for s in runs]
    cells = aggregate(points)
    budget = max(c["budget"] for c in cells)
    _heatmaps(cells, "plateau", f"steps on the chance plateau ({METRIC} >= {FLATLINE['level']})",
              fig_dir / "phase_plateau.png", vmax=budget,
              cbar_label=f"steps on the plateau (hatched, {budget}+: never left it)")
    _heatmaps(cells, "final", "final loss/copy", fig_dir / "phase_final_loss.png",
              vmax=max(c["ln_V"] for c in points), cbar_label="final loss/copy (nats; top: ln V, chance)")
    _scatter(points, fig_dir / "phase_plateau_vs_std.png")

    flat = defaultdict(lambda: [0, 0])
    for c in cells:
        flat[c["scale"]][0] += c["flat"]
        flat[c["scale"]][1] += 1
    summary = "; ".join(f"{sc}: {n} of {m} cells flat for the whole budget" for sc, (n, m) in sorted(flat.items()))
    flat_std = [c["pred_std"] for c in cells if c["flat"]]
    moving_std = [c["pred_std"] for c in cells if not c["flat"]]
    lines = [TITLE, "",
             f"{len(runs)} runs, {len(cells)} cells, budget {budget} steps. {summary}."]
    if flat_std and moving_std:
        lines.append(f"Smallest predicted score std among flat cells: {min(flat_std):.3g}; largest among "
                     f"cells that left the plateau: {max(moving_std):.3g}.")
    lines += ["", *pairs_table(cells)]
    lines += ["", "![plateau](figures/phase_plateau.png)", "",
              f"*Look at: the hatched cells ({budget}+) never left the plateau; compare each unscaled "
              "cell with the scaled cell at the same place beside it, and whether the hatching follows "
              "a large σ.*", "",
              "![final loss](figures/phase_final_loss.png)", "",
              "*Look at: cells at the top of the colour bar (ln V) ended at chance; an unscaled cell "
              "there whose scaled twin ended low is the flatline.*", "",
              "![plateau vs predicted std](figures/phase_plateau_vs_std.png)", "",
              "*Look at: whether plateau length rises with the predicted score std, and where the arrows "
              "(runs still on the plateau at the budget, so longer than drawn) begin.*", "",
              "| optimizer | scale | q/k init | d_k | predicted score std | measured at step 0 "
              "| plateau steps | final loss/copy | seeds |",
              "|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        div = f" ({c['diverged']} diverged)" if c["diverged"] else ""
        lines.append(f"| {c['optim']} | {c['scale']} | {c['init']} | {c['d_k']} | {_fmt(c['pred_std'])} "
                     f"| {_fmt(c['init_std'])} | {_fmt(c['plateau'], '.0f')}{' (capped)' if c['flat'] else ''} "
                     f"| {_fmt(c['final'])} | {c['seeds']}{div} |")
    return "\n".join(lines)
