"""Reporting: results/ -> REPORT.md, runs.csv, figures/ (and README's report blocks).

    python -m experiments.report [DIR ...] [--out OUT] [--readme README.md]

Reads what runs left on disk (summary.json, metrics.csv, attention weights) and nothing else:
this package imports neither torch nor wandb (a test holds it to that).
"""
from experiments.report.build import build, header, main, render_blocks, update_readme  # noqa: F401
from experiments.report.runs import load_runs, runs_table  # noqa: F401
