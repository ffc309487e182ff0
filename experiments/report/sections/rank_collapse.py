"""Rank collapse (Dong, Cordonnier, Loukas 2021): the rank-1 residual ||X - 1 x^T||_F / ||X||_F of
the token representations per layer of an attention-only stack, without skip connections
(`+exp=rank_collapse`) and with them (its control), at init and after training; and the depth
sweep (`-m +exp=rank_collapse_depth`): the last layer's residual against depth."""
import math
from collections import defaultdict
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.records import RunRecord  # noqa: E402
from experiments.report.figures import save

NAME = "rank_collapse"
EXP, SWEEP = "rank_collapse", "rank_collapse_depth"
WHEN = ("init", "trained")


def per_depth(final: dict, when: str) -> list[float]:
    """[res at depth 0 (embeddings), 1, ..., n_layers] from a run's final metrics."""
    out, i = [], 0
    while f"rank/{when}/depth{i}" in final:
        out.append(final[f"rank/{when}/depth{i}"])
        i += 1
    return out


def _mean(curves: list[list[float]]) -> np.ndarray:
    n = min(len(c) for c in curves)
    return np.exp(np.mean([np.log(np.maximum(c[:n], 1e-30)) for c in curves], axis=0))  # geometric: log axis


def _profile_lines(stacks: dict) -> list[str]:
    lines = ["| stack | when | " + " | ".join(f"depth {d}" for d in (1, 2, 4, 8, 12) if d < len(next(iter(stacks.values()))["init"])) + " | per-layer factor (depths 1-4 / last 4) | seeds |",
             "|---|---|" + "---|" * sum(d < len(next(iter(stacks.values()))["init"]) for d in (1, 2, 4, 8, 12)) + "---|---|"]
    for label, s in stacks.items():
        for when in WHEN:
            m = s[when]
            cols = " | ".join(f"{m[d]:.2e}" for d in (1, 2, 4, 8, 12) if d < len(m))
            # doubly exponential: the per-layer factor res_{l+1}/res_l shrinks with depth; exponential: constant
            early = (m[min(4, len(m) - 1)] / m[1]) ** (1 / max(1, min(4, len(m) - 1) - 1)) if len(m) > 2 else math.nan
            late = (m[-1] / m[-5]) ** (1 / 4) if len(m) > 5 else math.nan
            lines.append(f"| {label} | {when} | {cols} | {early:.2f} / {late:.2f} | {s['seeds']} |")
    return lines


def _figure(stacks: dict, sweep: dict, path: Path):
    """Left: residual per layer of the 12-layer stacks; right: the depth sweep (each when present)."""
    panels = [p for p, have in (("layers", stacks), ("sweep", sweep)) if have]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.5), squeeze=False, layout="constrained")
    colours = {"no skips": "tab:red", "skips": "tab:blue"}
    for ax, panel in zip(axes[0], panels):
        if panel == "layers":
            for label, s in stacks.items():
                for when, ls in zip(WHEN, ("--", "-")):
                    ax.plot(range(len(s[when])), s[when], ls=ls, marker="o", ms=3, color=colours.get(label, "grey"),
                            label=f"{label}, {when}")
            ax.set_xlabel("depth (0: embeddings)")
            ax.set_ylabel("rank-1 residual ||X - 1x^T||_F / ||X||_F")
            ax.set_title("per layer, 12-layer attention-only stack", fontsize=9)
        else:
            for (label, when), pts in sorted(sweep.items()):
                ds = sorted(pts)
                ax.plot(ds, [pts[d] for d in ds], ls="--" if when == "init" else "-", marker="o", ms=3,
                        color=colours.get(label, "grey"), label=f"{label}, {when}")
            ax.set_xlabel("number of layers (one model per point)")
            ax.set_ylabel("last layer's rank-1 residual")
            ax.set_title("depth sweep", fontsize=9)
        ax.set_yscale("log")
        ax.legend(fontsize=7, handlelength=4)  # long enough to tell init (dashed) from trained
    save(fig, path)


def render(runs: list[RunRecord], fig_dir: Path) -> str | None:
    fails = [r for r in runs if r.exp == EXP and r.final and r.status == "completed"]
    swept = [r for r in runs if r.exp == SWEEP and r.final and r.status == "completed"]
    if not fails and not swept:
        return None
    fig_dir = Path(fig_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)
    stacks = {}
    groups = {"no skips": fails, "skips": [r.control_run for r in fails if r.control_run is not None and r.control_run.final]}
    for label, rs in groups.items():
        if rs:
            stacks[label] = {w: _mean([per_depth(r.final, w) for r in rs]) for w in WHEN} | {"seeds": len(rs)}
    sweep = defaultdict(dict)
    by = defaultdict(list)
    for r in swept:
        label = "skips" if r.config["model"]["residual"] else "no skips"
        for w in WHEN:
            by[(label, w, r.config["model"]["n_layers"])].append(r.final[f"rank/{w}/last"])
    for (label, w, d), vs in by.items():
        sweep[(label, w)][d] = float(np.exp(np.mean(np.log(np.maximum(vs, 1e-30)))))
    _figure(stacks, dict(sweep), fig_dir / "rank_collapse.png")
    lines = ["## Rank collapse in attention-only stacks (rank_collapse)", "",
             "Dong, Cordonnier, Loukas 2021 (arXiv 2103.03404). res(X) = ||X - 1 x^T||_F / ||X||_F, x the mean "
             "token (Frobenius norm; the paper's bound uses a composite l1/l_inf norm), on one validation "
             "batch, geometric mean over seeds. Doubly exponential decay shows as a per-layer factor "
             "res(l+1)/res(l) that shrinks with depth; a constant factor is exponential decay. Values "
             "near 1e-7 are float32's floor: a factor computed across it understates the decay.", ""]
    if stacks:
        lines += _profile_lines(stacks) + [""]
    if sweep:
        depths = sorted({d for pts in sweep.values() for d in pts})
        lines += ["Depth sweep: the last layer's residual per model depth.", "",
                  "| stack | when | " + " | ".join(f"{d} layers" for d in depths) + " |",
                  "|---|---|" + "---|" * len(depths)]
        for (label, w), pts in sorted(sweep.items()):
            lines.append(f"| {label} | {w} | " + " | ".join(f"{pts[d]:.2e}" if d in pts else "–" for d in depths) + " |")
        lines.append("")
    lines += ["![rank collapse](figures/rank_collapse.png)", "",
              "*Look at: the red curves (no skips) falling on the log axis with depth, the blue (skips) flat; "
              "a straight red line is exponential decay, one that bends down is doubly exponential.*"]
    return "\n".join(lines)
