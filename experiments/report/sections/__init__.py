"""Report sections, discovered by name: every module in this package with

    NAME = "heads"                                  # README marker: <!-- BEGIN report:heads -->
    ORDER = 50                                      # optional; lower first (catalogue is 0)
    def render(runs: list[RunRecord], fig_dir: Path) -> str | None

is one section of REPORT.md. `runs` are the records (experiments.records.RunRecord) of every run
found: failures, baselines and their controls (`role` says which; a failure's `control_run` is
its control's record); `run.metrics_frame()` reads a run's metrics.csv. A section writes its
PNGs into fig_dir and links them as `figures/<file>` (REPORT.md sits beside figures/). It returns
markdown, or None when none of its runs exist (the section is then left out).
Rendering must be deterministic: same runs in, same bytes out (no timestamps, no absolute paths).
"""
import importlib
import pkgutil
from pathlib import Path


def discover() -> list:
    """The section modules, ordered by (ORDER, NAME)."""
    mods = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)
            if not m.name.startswith("_")]
    mods = [m for m in mods if hasattr(m, "NAME") and hasattr(m, "render")]
    return sorted(mods, key=lambda m: (getattr(m, "ORDER", 50), m.NAME))


def sweep_runs(runs: list, exp: str, fig_dir) -> list:
    """The runs of sweep preset `exp` that finished (completed or diverged), with fig_dir made
    for their figures when there are any."""
    out = [r for r in runs if r.exp == exp and r.config and r.status in ("completed", "diverged")]
    if out:
        Path(fig_dir).mkdir(parents=True, exist_ok=True)
    return out
