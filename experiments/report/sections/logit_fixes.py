"""The fixes for exploding attention logits on one page (`-m +exp=logit_fixes`): logit_growth's
failing run with each fix, one table (mean over seeds, min-max beside it) and one figure."""
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

NAME = "logit_fixes"
EXP = "logit_fixes"
SOLVED = 0.1  # steps to solve: first logged step with training loss/copy <= 0.1 ln V
ORDER_OF = ("none", "qk_layernorm", "softcap", "qk_clip", "sigma_reparam")


def fix_of(cfg: dict) -> str:
    """The fix a run's config turns on (conf/fix/), read from its attention keys."""
    a = cfg["model"]["attention"]
    on = [name for name, value in (("qk_layernorm", a.get("qk_norm")), ("softcap", a.get("softcap")),
                                   ("qk_clip", a.get("qk_clip")), ("sigma_reparam", a.get("sigma_reparam")))
          if value not in (None, False)]
    return "+".join(on) or "none"


def fix_label(cfg: dict) -> str:
    a, fix = cfg["model"]["attention"], fix_of(cfg)
    if fix == "softcap":
        return f"softcap c={a['softcap']:g}"
    if fix == "qk_clip":
        return f"qk_clip tau={a['qk_clip']:g}"
    return fix


def point(run: RunRecord) -> dict:
    """One run's row: max logit over steps and layers, last entropy per layer, final loss, steps
    to solve, cost."""
    df = run.metrics_frame()
    ln_v = run.context.get("ln_V") or math.log(run.config["data"]["vocab_size"])
    logit_cols = [c for c in df.columns if c.startswith("attn/max_score/L")]
    ent_cols = sorted(c for c in df.columns if c.startswith("attn/entropy/L"))
    diag = df.dropna(subset=ent_cols) if ent_cols else df
    solved = df[df["loss/copy"] <= SOLVED * ln_v]["step"] if "loss/copy" in df else []
    fin = run.final or {}
    return {"fix": fix_of(run.config), "label": fix_label(run.config), "seed": run.seed, "status": run.status,
            "max_logit": float(np.nanmax(df[logit_cols].to_numpy())) if logit_cols else math.nan,
            "entropy": [float(diag[c].iloc[-1]) for c in ent_cols] if len(diag) else [],
            "entropy_0": float(diag[ent_cols].iloc[0].mean()) if len(diag) and ent_cols else math.nan,
            "loss": fin.get("loss/copy", math.nan) if run.status == "completed" else math.nan,
            "solved_at": float(solved.iloc[0]) if len(solved) else None,
            "ms": fin.get("cost/step_ms", math.nan), "ratio": fin.get("cost/time_ratio_vs_no_fix", math.nan),
            "budget": run.config["train"]["steps"], "lr": run.config["optim"]["lr"], "ln_V": ln_v,
            "df": df[["step", "loss/copy", *logit_cols]] if "loss/copy" in df else None}


def _spread(xs, spec=".3g") -> str:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    if not xs:
        return "–"
    if len(xs) == 1:
        return format(xs[0], spec)
    return f"{format(float(np.mean(xs)), spec)} ({format(min(xs), spec)}–{format(max(xs), spec)})"


def _figure(groups: dict, path: Path):
    """Max logit (log scale) and loss/copy over steps, one colour per fix, one line per seed."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained")
    colors = dict(zip(ORDER_OF, plt.cm.tab10.colors))
    for fix, ps in groups.items():
        for i, p in enumerate(ps):
            df = p["df"]
            if df is None:
                continue
            cols = [c for c in df.columns if c.startswith("attn/max_score/L")]
            d = df.dropna(subset=cols)
            kw = dict(color=colors.get(fix, "k"), lw=1, alpha=0.8, label=p["label"] if i == 0 else None)
            a1.plot(d["step"], d[cols].max(axis=1), **kw)
            a2.plot(df["step"], df["loss/copy"], **kw)
    a1.set_yscale("log")
    a1.set_xlabel("step")
    a1.set_ylabel("max |attention logit| over layers")
    a2.set_xlabel("step")
    a2.set_ylabel("loss/copy (nats, train batch)")
    a1.legend(fontsize=7)
    fig.suptitle("logit_growth's run with each fix (one line per seed)", fontsize=10)
    save(fig, path)


def render(runs: list[RunRecord], fig_dir: Path) -> str | None:
    runs = sweep_runs(runs, EXP, fig_dir)
    if not runs:
        return None
    fig_dir = Path(fig_dir)
    groups = defaultdict(list)
    for p in sorted((point(r) for r in runs), key=lambda p: (p["fix"], p["seed"] or 0)):
        groups[p["fix"]].append(p)
    groups = dict(sorted(groups.items(), key=lambda kv: (ORDER_OF.index(kv[0]) if kv[0] in ORDER_OF else 99, kv[0])))
    _figure(groups, fig_dir / "fixes_logits.png")
    first = next(iter(groups.values()))[0]
    base = groups.get("none") or [p for ps in groups.values() for p in ps]
    lrs = sorted({p["lr"] for ps in groups.values() for p in ps})
    lines = ["## The fixes for exploding attention logits, side by side (logit_fixes)", "",
             f"logit_growth's failing run (lr {', '.join(f'{x:g}' for x in lrs)}, {first['budget']} steps, copy task) "
             "with each fix; mean over seeds, (min–max) beside it. max logit: the largest |score| any layer "
             "showed on a diagnostic step (for softcap, after the cap); final entropy: each layer's mean row "
             f"entropy at the last step (nats; {_spread([p['entropy_0'] for p in base], '.3g')} at step 0 "
             f"{'without a fix' if 'none' in groups else 'here'}, near-uniform causal attention); final loss: eval loss/copy; "
             f"steps to solve: first logged step with training loss/copy <= {SOLVED:g} ln V "
             f"({SOLVED * first['ln_V']:.2f} nats), over the seeds that got there; cost: a forward, backward "
             "(and QK-clip's rescaling) with the fix, against the same model without it, interleaved in one "
             "process after training, median of 9 (the no-fix row's ratio is its noise).", "",
             "| fix | seeds | max logit | final entropy L0 / L1 | final loss/copy | solved | steps to solve "
             "| ms per step | vs no fix |",
             "|---|---|---|---|---|---|---|---|---|"]
    for fix, ps in groups.items():
        n_layers = max(len(p["entropy"]) for p in ps)
        ent = " / ".join(_spread([p["entropy"][i] for p in ps if len(p["entropy"]) > i], ".2g") for i in range(n_layers))
        solved = [p["solved_at"] for p in ps if p["solved_at"] is not None]
        div = sum(p["status"] == "diverged" for p in ps)
        lines.append(f"| {ps[0]['label']} | {len(ps)}{f' ({div} diverged)' if div else ''} "
                     f"| {_spread([p['max_logit'] for p in ps])} | {ent} | {_spread([p['loss'] for p in ps])} "
                     f"| {len(solved)} of {len(ps)} | {_spread(solved, '.0f')} "
                     f"| {_spread([p['ms'] for p in ps], '.1f')} | {_spread([p['ratio'] for p in ps], '.2f')} |")
    lines += ["", "![max logit and loss per fix](figures/fixes_logits.png)", "",
              "*Look at: the no-fix lines climbing to thousands on the left while their loss stays at "
              "chance on the right; a fix holds where its logits stay bounded **and** its loss falls.*"]
    return "\n".join(lines)
