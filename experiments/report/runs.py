"""Every run under some dirs, read back as RunRecords, and the tidy table of them (runs.csv)."""
import functools
import re
import sys
from pathlib import Path

from experiments.config import experiment_data
from experiments.layout import CHECKPOINTS, FIGURES, SUMMARY, WANDB
from experiments.on_text import on_text, run_data
from experiments.records import RunRecord, flatten

STAMP = re.compile(r"\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}(?:-\d+)?")
SKIP_PARTS = (WANDB, CHECKPOINTS, FIGURES)


def display(path: Path) -> str:
    """A path as the report shows it: relative to the working directory when it lies below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


@functools.cache
def own_data(exp_name: str) -> str | None:
    """The data experiment exp_name is defined on (its conf/exp file's); None for no experiment."""
    try:
        return experiment_data(exp_name)
    except Exception:  # noqa: BLE001  no conf/exp file of that name (a control's own name): not an experiment, None
        return None


def text_version(run: RunRecord) -> bool:
    """A run of an experiment's text version: on text data that is not the data its experiment is
    defined on. attention_sink, defined on lines of text, is a catalogue run; a control counts as
    its experiment's (exp.group)."""
    exp = ((run.config or {}).get("exp") or {}).get("group") or run.exp
    return on_text(run) and run_data(run) != own_data(exp)


def control_name(run: RunRecord) -> str:
    """The name `run`'s experiment gives its control. A control shared by several experiments is
    one run dir whose summary.json holds the name of the experiment that trained it first."""
    return (run.control or {}).get("name") or (run.control_run.exp if run.control_run else "control")


def _summary_files(d: Path):
    for p in sorted(Path(d).rglob(SUMMARY)):
        rel = p.relative_to(d).parts[:-1]
        if any(part.startswith(".") or part in SKIP_PARTS for part in rel):
            continue
        yield p


def _read(path: Path) -> RunRecord | None:
    try:
        return RunRecord.read(path.parent, id=display(path.parent))
    except (OSError, ValueError, TypeError) as e:
        print(f"report: skipping {path}: {e}", file=sys.stderr)
        return None


def load_runs(dirs) -> list[RunRecord]:
    """Every run under `dirs` and the control (and no-attention floor) of each, newest run per (exp, role, config),
    each failure linked to its control's record (`control_run`)."""
    found = [r for d in dirs for p in _summary_files(Path(d)) if (r := _read(p))]
    for r in list(found):
        for cdir in ((r.control or {}).get("dir"), (r.floor or {}).get("dir")):  # floor: text versions
            if cdir and (Path(cdir) / SUMMARY).exists():
                found.append(_read(Path(cdir) / SUMMARY))
    latest: dict = {}
    for r in found:
        key = (r.exp, r.role, r.config_hash or r.id)
        stamp = (STAMP.findall(str(r.dir)) or [""])[-1]
        rank = (stamp, str(r.dir))
        if key not in latest or rank > latest[key][0]:
            latest[key] = (rank, r)
    out = sorted((r for _, r in latest.values()),
                 key=lambda r: (r.exp, r.is_control, r.variant, r.seed or 0, r.id))
    by_dir = {Path(r.dir).resolve(): r for r in out}
    # a control's dir is recorded relative to where run.py ran; read from elsewhere, its config
    # hash (the control dir's own key) still finds it
    by_hash = {r.config_hash: r for r in out if r.is_control and r.config_hash}
    for r in out:
        cdir, chash = (r.control or {}).get("dir"), (r.control or {}).get("config_hash")
        r.control_run = (by_dir.get(Path(cdir).resolve()) if cdir else None) or by_hash.get(chash)
    return out


def runs_table(runs: list[RunRecord]):
    """Tidy: one row per run and logged step; run fields and config fields as columns, then
    the metrics (slash names, as in metrics.csv and W&B)."""
    import pandas as pd
    frames = []
    for r in runs:
        m = r.metrics_frame()
        if m.empty:
            m = pd.DataFrame({"step": [None]})
        cfg = {k: v for k, v in flatten(r.config).items() if not k.startswith("exp.") or k == "exp.name"}
        meta = {"run": r.id, "exp": r.exp, "role": r.role, "seed": r.seed, "status": r.status,
                "reproduced": (r.verdict or {}).get("reproduced"), "variant": r.variant,
                **{f"config.{k}": v for k, v in cfg.items()}}
        meta_df = pd.DataFrame({k: [v] * len(m) for k, v in meta.items()}, index=m.index)
        frames.append(pd.concat([meta_df, m], axis=1))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def sweep_runs(runs: list, exp: str, fig_dir) -> list:
    """The runs of sweep preset `exp` that finished (completed or diverged), with fig_dir made
    for their figures when there are any."""
    out = [r for r in runs if r.exp == exp and r.config and r.status in ("completed", "diverged")]
    if out:
        Path(fig_dir).mkdir(parents=True, exist_ok=True)
    return out
