"""Report sections, discovered by name: every module in this package with

    NAME = "heads"                                  # README marker: <!-- BEGIN report:heads -->
    ORDER = 50                                      # optional; lower first (catalogue is 0)
    def render(summaries: list[dict], fig_dir: Path) -> str | None

is one section of REPORT.md. `summaries` are the loaded summary.json dicts of every run found
(failures, baselines and their controls: `role` says which), each with `_dir` (the run dir,
a Path) added; `metrics(s)` below reads a run's metrics.csv. A section writes its PNGs into
fig_dir and links them as `figures/<file>` (REPORT.md sits beside figures/). It returns
markdown, or None when none of its runs exist (the section is then left out).
Rendering must be deterministic: same runs in, same bytes out (no timestamps, no absolute paths).
"""
import importlib
import pkgutil
from pathlib import Path

import pandas as pd


def discover() -> list:
    """The section modules, ordered by (ORDER, NAME)."""
    mods = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)
            if not m.name.startswith("_")]
    mods = [m for m in mods if hasattr(m, "NAME") and hasattr(m, "render")]
    return sorted(mods, key=lambda m: (getattr(m, "ORDER", 50), m.NAME))


def metrics(summary: dict) -> pd.DataFrame:
    """A run's metrics.csv (one row per logged step); empty when the run left none."""
    path = Path(summary["_dir"]) / "metrics.csv"
    try:
        return pd.read_csv(path)
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return pd.DataFrame()
