"""The figure of a run (curves.png) and of an experiment in the report: the failure next to its
control, and the diagnostics that explain it."""
import textwrap
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.report import verdict_panel  # noqa: E402


def save(fig, path) -> None:
    """A section's figure to PNG, without the Software tag (same runs, same bytes), then closed."""
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


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


def has_head(attn_weights: dict, layer: str, head: int) -> bool:
    """Whether every recorded step has this layer and head."""
    return all(layer in w and head < len(w[layer]) for w in attn_weights.values())


def shown_heads(weights: list) -> list:
    """The (layer, head) whose heatmaps each run shows: the first run's most focused head, and the
    same layer and head for the others (the control beside the failure) wherever they have it."""
    first = pick_head(weights[0]) if weights and weights[0] else None
    return [None if not w else first if first and has_head(w, *first) else pick_head(w) for w in weights]


def _heatmap(ax, w, title):
    im = ax.imshow(np.asarray(w, dtype=np.float32), cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    ax.set_title(title, fontsize=8, y=1.0)  # y given: not re-placed around the tick labels at each draw
    ax.set_xlabel("key position", fontsize=8)
    ax.set_ylabel("query position", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.locator_params(nbins=4)  # few ticks: each is artists to make and text to draw
    return im


def plot_experiment(path: Path, name: str, runs: list, controls: list, control_name: str = "control",
                    loss_metric: str = "loss/copy", chance: float | None = None, third: str | None = None,
                    verdicts: list | None = None):
    """runs / controls: [(label, metrics DataFrame, attn_weights {step: {layer: (h,T,T)}} or None)].
    verdicts: [(seed, the run's verdict)]: the verdict panel on the right (report.verdict_panel).
    Top: loss (failure vs control on the same axes), attention entropy and the saturation
    gradient mean |dL/dscores| (both averaged over layers; `third` names another metric for that
    panel, the one an experiment's signature is about); log scale where a panel spans
    decades; one legend for the three, beside them, so it covers no curve. Bottom: one head's
    weights at step 0 and at the end, for the first run of each, on one colour scale: the
    failure's most focused head, and the same layer and head of the control."""
    n_heat = 2 * (1 + bool(controls))
    # a fixed layout, not "constrained": that one draws the figure twice and measures every label
    # (2.6 s of CPU per figure against 1.5); these margins hold the longest labels
    width = 20 if verdicts else 14
    fig = plt.figure(figsize=(width, 8.2))
    fig.suptitle(name)
    margins = dict(left=0.9 / width, right=1 - 0.2 / width, bottom=0.07, top=0.9)
    if verdicts:
        outer = fig.add_gridspec(1, 2, width_ratios=[14, 6], wspace=0.1, **margins)
        rows = outer[0].subgridspec(2, 1, height_ratios=[1, 1.05], hspace=0.3)
        verdict_panel.draw(fig, outer[1], verdicts)
    else:
        rows = fig.add_gridspec(2, 1, height_ratios=[1, 1.05], hspace=0.3, **margins)
    top_grid = rows[0].subgridspec(1, 4, width_ratios=[1, 1, 1, 0.5], wspace=0.4)
    top = [fig.add_subplot(top_grid[0, i]) for i in range(3)]
    panels = [(loss_metric, f"{loss_metric}", f"{loss_metric} (nats)"),
              ("attn/entropy", "attention entropy (mean over layers)", "entropy per row (nats)"),
              ("grad/scores", "saturation gradient (mean over layers)", "mean |dL/dscores| (nats per unit score)")
              if third is None else (third, third, third)]
    for ax, (key, title, ylabel) in zip(top, panels):
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
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel, fontsize=9)
        if not ax.has_data():
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, fontsize=8)
    handles, labels = top[0].get_legend_handles_labels()
    if handles:
        legend_ax = fig.add_subplot(top_grid[0, 3])
        legend_ax.set_axis_off()
        labels = [textwrap.fill(l, 30) for l in labels]  # a control's label is long: kept in its column
        legend_ax.legend(handles, labels, loc="center left", fontsize=8, frameon=False)
    heat_grid = rows[1].subgridspec(1, n_heat, wspace=0.35)
    col, im, heat_axes = 0, None, []
    groups = [g for g in (runs, controls) if g]
    for group, picked in zip(groups, shown_heads([g[0][2] for g in groups])):
        label, _, weights = group[0]
        for which in ("first", "last"):
            ax = fig.add_subplot(heat_grid[0, col])
            heat_axes.append(ax)
            col += 1
            step = (min(weights) if which == "first" else max(weights)) if picked else None
            if picked is None or (which == "last" and step == min(weights)):
                why = "no attention weights recorded" if picked is None else "no later step recorded"
                ax.text(0.5, 0.5, why, ha="center", va="center", fontsize=8)
                ax.set_axis_off()
                continue
            layer, head = picked
            im = _heatmap(ax, weights[step][layer][head], textwrap.fill(f"{label}: {layer} H{head}, step {step}", 42))
    if im is not None:
        fig.colorbar(im, ax=heat_axes, shrink=0.85, aspect=25, label="attention weight (a row sums to 1)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _panel(check: dict, loss_metric: str, third: str | None = None) -> str | None:
    """Where in plot_experiment's figure a check's metric can be seen, or None."""
    metric, at0 = check.get("metric") or "", check.get("at") == 0
    if third and metric == third:
        return f"the {third} panel"
    if check.get("kind") == "status":
        return {"diverged": "where the solid curves end, as the run diverged",
                "error": "the missing solid curves, as the run stopped with an error"}.get(check.get("value"))
    if metric == loss_metric or metric.startswith("loss/"):
        return "the loss panel"
    if metric.startswith("attn/entropy"):
        return "the entropy panel" + (" at step 0" if at0 else "")
    if metric.startswith("grad/scores"):
        return "the gradient panel" + (" at step 0" if at0 else "")
    if metric.startswith(("attn/saturated", "attn/max_score", "attn/negative_weights")):
        return "the step-0 heatmap" if at0 else "the heatmaps"
    return None


def look_at(spec: dict, failure: str, control: str | None, loss_metric: str = "loss/copy") -> str:
    """The figure's one-line caption: which panel shows each check of the experiment's signature
    (spec: the run's config `exp`, with `expect` and `checks`). Built from the config, so it
    carries no measured number."""
    checks = [{"name": k, **(spec.get("checks") or {}).get(k, {})} for k in spec.get("expect") or []]
    checks = [c for c in checks if not c.get("report_only")]
    where: dict[str, list[str]] = {}
    for c in checks:
        if (p := _panel(c, loss_metric, spec.get("figure_metric"))) is not None:
            where.setdefault(p, []).append(c["name"])
    vs = f" against dashed blue (its control `{control}`)" if control else ""
    if not where:
        names = "; ".join(c["name"] for c in checks)
        return (f"Look at: solid red ({failure}){vs} in the loss panel; "
                + (f"what is checked ({names}) is measured apart from these curves: the verdict panel "
                   "(right) has each value per seed against its threshold." if names
                   else "no check is drawn here."))
    return f"Look at: solid red ({failure}){vs}: " + "; ".join(
        f"{p} ({'; '.join(names)})" for p, names in where.items()) + \
        "; every check per seed against its threshold: the verdict panel (right)."


def control_label(ctrl: dict) -> str:
    """A run's control as its figure names it: the experiment's name for it, its config hash and
    the experiment it was trained for (a shared control may have been trained for another one)."""
    was = [f"config {ctrl['config_hash']}"] + ([f"trained for {ctrl['trained_for']}"] if ctrl.get("trained_for") else [])
    return f"{ctrl['name']} (control; {', '.join(was)})"


def draw_curves(record, path) -> None:
    """A judged run's curves.png: its curves and heatmaps against its control's (plot_experiment),
    read back from the two run dirs."""
    from experiments.layout import METRICS
    from experiments.records import read_attn_weights, read_rows, rows_frame
    spec = record.config["exp"]
    ctrl = record.control
    controls = ([(control_label(ctrl), rows_frame(read_rows(Path(ctrl["dir"]) / METRICS)), read_attn_weights(ctrl["dir"]))]
                if ctrl else [])
    plot_experiment(path, record.title(), [(spec["name"], record.metrics_frame(), record.attn_weights())],
                    controls, control_name=controls[0][0] if controls else "control",
                    loss_metric=spec["loss_metric"], chance=record.context["ln_V"], third=spec.get("figure_metric"),
                    verdicts=[(record.config["seed"], record.verdict)])
