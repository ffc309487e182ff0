"""The lesson's headline at the lesson's scale (`-m +exp=lesson_scale`): a 32,768-token byte-pair LM
with d_model 512 and 8 heads of d_k 64, scaled and unscaled, per q/k init and optimizer; each cell
held to the lesson's sentence (experiments/judging/lesson.py) with its numbers. Two blocks: the
summary (the README's `report:lesson_scale`) and the per-cell table with the curves."""
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.judging import lesson  # noqa: E402
from experiments.records import RunRecord  # noqa: E402
from experiments.report.figures import save  # noqa: E402
from experiments.report.runs import sweep_runs  # noqa: E402
from experiments.report.sections.phase import labels  # noqa: E402

NAME = "lesson_scale"
TITLE = "## The lesson's sentence at the lesson's scale (lesson_scale)"
EXP = "lesson_scale"
METRIC = "loss/train"
FIGURE = "lesson_scale_curves.png"
SENTENCE = "starts at 10.4, drops to 9.8 in the first fifty steps, then flat"


def _layers_mean(row: dict, prefix: str) -> float:
    """The mean over layers of `prefix`L<i> in one metrics row (NaN when not logged there)."""
    vals = [float(v) for k, v in row.items() if k.startswith(prefix) and k[len(prefix):].isdigit() and v is not None]
    return sum(vals) / len(vals) if vals else math.nan


def cell(run: RunRecord) -> dict:
    """One run's row: its labels, the sentence judged on its train loss, the attention at init."""
    cfg, rows = run.config, run.metrics()
    ln_v = (run.context or {}).get("ln_V") or math.log(cfg["data"]["vocab_size"])
    series = [(r["step"], r[METRIC]) for r in rows if r.get(METRIC) is not None]
    first = next((r for r in rows if r.get("step") == 0), {})
    return {**labels(cfg), "seed": run.seed, "status": run.status, "ln_V": ln_v, "steps": cfg["train"]["steps"],
            "verdict": lesson.judge(series, ln_v, cfg["train"]["steps"]), "series": series, "T": cfg["data"]["seq_len"],
            "saturated": _layers_mean(first, "attn/saturated/L"), "grad_scores": _layers_mean(first, "grad/scores/L"),
            "final": run.final.get(METRIC) if run.status == "completed" else math.nan}


def _order(c: dict):
    return (c["optim"], ("gpt2", "torch_default", "unit_variance").index(c["init"]) if c["init"] in
            ("gpt2", "torch_default", "unit_variance") else 9, c["init"], c["scale"] != "unscaled", c["seed"] or 0)


def _f(x, spec=".2f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _plateau(v: lesson.LessonVerdict) -> str:
    """Its length (+: capped; <=: it left at the first step the 11-step means can tell) and level."""
    first = v.plateau_steps <= lesson.WINDOW + 1 and not v.plateau_capped and v.diverged_at is None
    return f"{'≤ ' if first else ''}{v.plateau_steps:.0f}{'+' if v.plateau_capped else ''} at {_f(v.plateau_level)}"


def _word(v: lesson.LessonVerdict) -> str:
    if v.diverged_at is not None:
        return f"refuted (diverged at step {v.diverged_at})"
    if v.held:
        return "**held**"
    failed = [c.name for c in (v.start, v.at_50, v.flat) if not c.held]
    return "refuted: " + ", ".join(failed) + (" (shape held)" if v.shape else "")


def summary(cells: list[dict]) -> str:
    """The sentence per cell, unscaled (the lesson's bug) and scaled (where holding it would say the
    flatline is not the missing scale's), and the loss path of each pair of twins."""
    name = lambda c: f"{c['optim']}/{c['init']}"  # noqa: E731
    c0 = cells[0]

    def tally(scale: str) -> str:
        mine = [c for c in cells if c["scale"] == scale]
        held = [c for c in mine if c["verdict"].held]
        shape = [c for c in mine if c["verdict"].shape and not c["verdict"].held]
        return (f"{scale}: **{len(held)} of {len(mine)}**" + (f" ({', '.join(map(name, held))})" if held else "")
                + (f", its shape (chance, then flat, at another level) in {len(shape)} more ({', '.join(map(name, shape))})"
                   if shape else ""))
    lines = [TITLE, "",
             f"The lesson: \"{SENTENCE}\". {len(cells)} runs of a byte-pair LM of V = {round(math.exp(c0['ln_V'])):,} "
             f"(ln V = {c0['ln_V']:.3f}), {max(c['steps'] for c in cells)} steps each, judged per cell: the start within "
             f"{lesson.START_TOL:g} of ln V, step 50 within {lesson.DROP_TOL:g} of ln V - {lesson.DROP:g}, then a fall "
             f"under {lesson.FLAT_TOL:g} nats to the end (experiments/judging/lesson.py). The sentence holds in "
             f"{tally('unscaled')}; {tally('scaled')}.", "",
             "| optimizer | q/k init | scaled: step 0 → 50 → end | unscaled: step 0 → 50 → end | unscaled: the sentence |",
             "|---|---|---|---|---|"]
    by = {(c["optim"], c["init"], c["scale"]): c for c in cells}

    def path(c):
        v = c and c["verdict"]
        return "–" if c is None else f"{_f(v.start.measured)} → {_f(v.at_50.measured)} → {_f(v.end_level)}"
    for o, i in dict.fromkeys((c["optim"], c["init"]) for c in cells):
        u = by.get((o, i, "unscaled"))
        lines.append(f"| {o} | {i} | {path(by.get((o, i, 'scaled')))} | {path(u)} | {_word(u['verdict']) if u else '–'} |")
    return "\n".join(lines)


def cells_table(cells: list[dict]) -> str:
    lines = ["### Per cell", "",
             "Loss: the train loss as logged (step 0: one batch; step 50: steps 50-60; end: the last fifth); "
             f"plateau: steps after step 50 before the loss (averaged as at step 50) falls {lesson.FLAT_TOL:g} nats "
             f"below its step-50 value (+: still on it at the end; ≤ {lesson.WINDOW + 1}: it left at the first step "
             "two 11-step means apart can tell), and its mean level; "
             "saturated rows (max weight > 0.99) and mean |dL/dscores| at step 0, averaged over layers, "
             "as the suite's diagnostics measure them (a causal row's first query has one key: 1/T of the rows, "
             f"{1 / cells[0]['T']:.3f} here, are saturated by construction).", "",
             "| optimizer | q/k init | scale | step 0 | step 50 | end | plateau (steps at level) | final eval loss "
             "| saturated rows at init | mean \\|dL/dscores\\| at init | the sentence |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        v = c["verdict"]
        lines.append(f"| {c['optim']} | {c['init']} | {c['scale']} | {_f(v.start.measured)} | {_f(v.at_50.measured)} "
                     f"| {_f(v.end_level)} | {_plateau(v)} | {_f(c['final'])} | {_f(c['saturated'], '.3f')} "
                     f"| {_f(c['grad_scores'], '.2e')} | {_word(v)} |")
    lines += ["", f"![lesson curves](figures/{FIGURE})", "",
              "*Look at: the dotted lines at ln V and ln V - 0.6 (the lesson's 10.4 and 9.8); a cell that holds "
              "the sentence starts on the first, reaches the second by step 50 and stays there. The frame ends 2 "
              "nats above ln V: a cell that starts higher enters from above.*"]
    return "\n".join(lines)


def _figure(cells: list[dict], path: Path):
    optims = sorted({c["optim"] for c in cells})
    fig, axes = plt.subplots(1, len(optims), figsize=(5.2 * len(optims), 3.6), squeeze=False, layout="constrained")
    colours = dict(zip(("gpt2", "torch_default", "unit_variance"), plt.cm.tab10.colors))
    for ax, o in zip(axes[0], optims):
        for c in (c for c in cells if c["optim"] == o):
            s = [(st, v) for st, v in c["series"] if math.isfinite(v)]
            ax.plot([p[0] for p in s], [p[1] for p in s], color=colours.get(c["init"], "grey"),
                    ls="-" if c["scale"] == "scaled" else "--", lw=1.2, label=f"{c['init']}, {c['scale']}")
        ln_v = cells[0]["ln_V"]
        for y in (ln_v, ln_v - lesson.DROP):
            ax.axhline(y, color="grey", ls=":", lw=0.8)
        ax.axvline(lesson.LANDMARK, color="grey", ls=":", lw=0.8)
        ax.set_title(o, fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel("train loss (nats)")
        ax.set_ylim(0, ln_v + 2)   # an init whose loss starts far above chance (torch_default) starts off the frame
        ax.legend(fontsize=6)
    save(fig, path)


def blocks(runs: list[RunRecord], fig_dir: Path) -> dict[str, str]:
    runs = sweep_runs(runs, EXP, fig_dir)
    if not runs:
        return {}
    cells = sorted((cell(r) for r in runs), key=_order)
    _figure(cells, Path(fig_dir) / FIGURE)
    return {NAME: summary(cells), f"{NAME}_cells": cells_table(cells)}


def render(runs: list[RunRecord], fig_dir: Path) -> str | None:
    b = blocks(runs, fig_dir)
    return "\n\n".join(b.values()) if b else None
