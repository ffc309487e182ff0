"""The figure of a run (curves.png) and of an experiment in the report: the failure next to its
control, and the diagnostics that explain it."""
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _spans_decades(ys) -> bool:
    pos = [y for y in ys if y and y > 0]
    return len(pos) > 1 and max(pos) / min(pos) > 100


def layer_mean(df, prefix: str):
    """Mean over layers of the columns `prefix/L<i>` (e.g. attn/entropy), or None."""
    cols = [c for c in df.columns if c.startswith(prefix + "/L") and c[len(prefix) + 2:].isdigit()]
    return df[cols].mean(axis=1) if cols else None


def row_entropy(w) -> np.ndarray:
    """Entropy per row in nats (attention.diagnostics.entropy, in numpy: the report loads no torch)."""
    w = np.asarray(w, dtype=np.float64)
    return -(w * np.log(np.clip(w, 1e-12, None))).sum(-1)


def pick_head(attn_weights: dict) -> tuple[str, int] | None:
    """The (layer, head) whose attention is most focused (lowest mean row entropy) at the last
    recorded step: where learning, or its failure, is easiest to see."""
    if not attn_weights:
        return None
    last = attn_weights[max(attn_weights)]
    best = None
    for layer in sorted(last):
        ent = row_entropy(last[layer]).mean(-1)  # (h,)
        for h, e in enumerate(ent.tolist()):
            if e == e and (best is None or e < best[0]):  # skip NaN heads
                best = (e, layer, h)
    return (best[1], best[2]) if best else (sorted(last)[0], 0)


def _heatmap(ax, w, title):
    ax.imshow(np.asarray(w, dtype=np.float32), cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("key", fontsize=8)
    ax.set_ylabel("query", fontsize=8)
    ax.tick_params(labelsize=7)


def plot_experiment(path: Path, name: str, runs: list, controls: list, control_name: str = "control",
                    loss_metric: str = "loss/copy", chance: float | None = None):
    """runs / controls: [(label, metrics DataFrame, attn_weights {step: {layer: (h,T,T)}} or None)].
    Top: loss (failure vs control on the same axes), attention entropy and the saturation
    gradient mean |dL/dscores| (both averaged over layers); log scale where a panel spans
    decades. Bottom: one head's weights at step 0 and at the end, for the first run of each."""
    n_heat = 2 * (1 + bool(controls))
    fig = plt.figure(figsize=(14, 7.6))
    grid = fig.add_gridspec(2, max(3, n_heat) * 4)
    width = grid.ncols // 3
    top = [fig.add_subplot(grid[0, i * width:(i + 1) * width]) for i in range(3)]
    panels = [(loss_metric, f"{loss_metric}"), ("attn/entropy", "attention entropy (nats, mean over layers)"),
              ("grad/scores", "saturation gradient mean |dL/dscores|")]
    for ax, (key, title) in zip(top, panels):
        all_y = []
        for group, style, color in ((runs, "-", "C3"), (controls, "--", "C0")):
            for i, (label, df, _) in enumerate(group):
                y = df[key] if key in df.columns else layer_mean(df, key)
                if y is None:
                    continue
                ok = np.isfinite(y.to_numpy(dtype=float))
                if ok.any():
                    ax.plot(df["step"][ok], y[ok], style, color=color, alpha=0.9 if i == 0 else 0.45,
                            label=label if i == 0 or len(group) < 4 else None)
                    all_y += y[ok].tolist()
        if key == loss_metric and chance:
            ax.axhline(chance, color="grey", lw=0.8, ls=":", label="chance (ln V)")
        if _spans_decades(all_y):
            ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        if ax.has_data():
            ax.legend(fontsize=8)
    heat_width = grid.ncols // n_heat
    col = 0
    for group in (runs, controls):
        if not group:
            continue
        label, _, weights = group[0]
        picked = pick_head(weights) if weights else None
        for which in ("first", "last"):
            ax = fig.add_subplot(grid[1, col * heat_width:(col + 1) * heat_width])
            col += 1
            if picked is None:
                ax.text(0.5, 0.5, "no attention weights recorded", ha="center", va="center", fontsize=8)
                ax.set_axis_off()
                continue
            step = min(weights) if which == "first" else max(weights)
            layer, head = picked
            _heatmap(ax, weights[step][layer][head], f"{label}: {layer} H{head}, step {step}")
    fig.suptitle(name)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
