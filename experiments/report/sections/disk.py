"""What runs write to disk, measured from the run dirs the report read: bytes per run dir by kind
(median and max over runs), and what the catalogue's runs and their controls take per seed, so a
user can size a sweep before starting it."""
import os
import statistics
from pathlib import Path

from experiments.layout import ATTN_WEIGHTS, CURVES, METRICS, WANDB
from experiments.records import RunRecord
from experiments.report.sections.catalogue import groups

NAME = "disk"
KINDS = (ATTN_WEIGHTS, METRICS, CURVES, f"{WANDB}/", "other")
# what the report itself may write into a dir it was pointed at (a single run dir): not the run's
REPORT_OUTPUTS = ("REPORT.md", "runs.csv", "figures")


def kind(rel: Path) -> str:
    """The kind of a file, by its path inside the run dir."""
    if rel.parts[0] == WANDB:
        return f"{WANDB}/"
    return rel.name if len(rel.parts) == 1 and rel.name in KINDS else "other"


def run_bytes(run_dir) -> dict[str, int]:
    """{kind: bytes} of every file under run_dir (links not followed), each kind present."""
    run_dir = Path(run_dir)
    out = dict.fromkeys(KINDS, 0)
    for root, dirs, files in os.walk(run_dir):
        rel_root = Path(root).relative_to(run_dir)
        if rel_root == Path("."):
            dirs[:] = [d for d in dirs if d not in REPORT_OUTPUTS]
            files = [f for f in files if f not in REPORT_OUTPUTS]
        for f in files:
            p = Path(root) / f
            if not p.is_symlink():
                out[kind(rel_root / f)] += p.stat().st_size
    return out


def size(b: float) -> str:
    """Bytes as a reader sizes a disk (powers of 1000)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B"


def catalogue_by_seed(runs: list[RunRecord], sizes: dict) -> list[tuple]:
    """(seed, runs, controls, bytes of runs, bytes of controls) for the catalogue: the experiments
    run with one config each (sweeps and experiments run with several configs count apart). A
    control shared by several experiments (same config) counts once per seed."""
    one_config = [g for g in groups(runs) if not g.is_sweep and "[" not in g.label]
    by_seed: dict = {}
    for g in one_config:
        for r in g.runs:
            d = by_seed.setdefault(r.seed, ({}, {}))
            d[0][str(r.dir)] = sizes[str(r.dir)]
            if r.control_run is not None:
                d[1][str(r.control_run.dir)] = sizes[str(r.control_run.dir)]
    return [(seed, len(rs), len(cs), sum(rs.values()), sum(cs.values()))
            for seed, (rs, cs) in sorted(by_seed.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))]


def render(runs: list[RunRecord], fig_dir: Path) -> str | None:
    dirs = sorted({str(r.dir) for r in runs if r.dir is not None and Path(r.dir).is_dir()})
    if not dirs:
        return None
    per_run = {d: run_bytes(d) for d in dirs}
    sizes = {d: sum(b.values()) for d, b in per_run.items()}
    rows = ["| in a run dir | median | max | all runs |", "|---|---|---|---|"]
    for k in (*KINDS, "total"):
        vals = [sizes[d] if k == "total" else per_run[d][k] for d in dirs]
        if k == "wandb/" and not any(vals):
            continue
        rows.append(f"| {k} | {size(statistics.median(vals))} | {size(max(vals))} | {size(sum(vals))} |")
    lines = [f"## What runs write to disk\n\nMeasured from the {len(dirs)} run dirs of this report "
             "(failures, baselines and controls), bytes per run dir by kind; other: summary.json, "
             "perf.csv, Hydra's `.hydra/` and the job log. Medians are per kind, so they do not add up. "
             "Checkpoints (`results/checkpoints/`) are removed when a run completes.\n", "\n".join(rows)]
    seeds = catalogue_by_seed(runs, sizes)
    if seeds:
        trows = ["| seed | runs | controls | runs' bytes | controls' bytes | total |", "|---|---|---|---|---|---|"]
        trows += [f"| {s} | {n} | {nc} | {size(b)} | {size(bc)} | {size(b + bc)} |" for s, n, nc, b, bc in seeds]
        lines += ["\nThe catalogue (the experiments run with one config each) per seed, with the controls "
                  "its runs trained; a multirun over S seeds writes about S times one row:\n", "\n".join(trows)]
    return "\n".join(lines) + "\n"
