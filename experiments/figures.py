"""Per-run figure: the failure next to its control, and the diagnostics that explain it."""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _series(rows, key):
    pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def _spans_decades(ys) -> bool:
    pos = [y for y in ys if y and y > 0]
    return len(pos) > 1 and max(pos) / min(pos) > 100


def plot_run(path: Path, name: str, rows: list[dict], control_rows: list[dict] | None = None,
             control_name: str = "control", loss_metric: str = "loss/copy", chance: float | None = None):
    panels = [(loss_metric, "loss"), ("attn/entropy/L0", "attention entropy L0 (nats)"),
              ("grad/scores/L0", "mean |dL/dscores| L0")]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for ax, (key, title) in zip(axes, panels):
        all_y = []
        for label, rs, style in ((name, rows, "-"), (control_name, control_rows, "--")):
            if rs:
                x, y = _series(rs, key)
                if x:
                    ax.plot(x, y, style, label=label)
                    all_y += y
        if key == loss_metric and chance:
            ax.axhline(chance, color="grey", lw=0.8, ls=":", label="chance (ln V)")
        if _spans_decades(all_y):
            ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
