"""Hydra callbacks: at the end of every multirun, the report goes into the sweep dir, one line per
experiment says in how many seeds it reproduced (and its control's rate), and the process exits
non-zero only if a job crashed unexpectedly. A verdict never sets the exit code: a run that did
not reproduce, a diverged run, or a failure whose signature is an error is a finding, not a crash."""
import json
import sys
import traceback
from pathlib import Path

from hydra.experimental.callback import Callback

from experiments.layout import FIGURES, HYDRA, METRICS, REJECTED, SKIPPED, SUMMARY, WANDB


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The jobs Hydra started: every dir under the sweep holding `.hydra/` (Hydra writes it
    before the task runs), or, when output_subdir is off, a summary.json or metrics.csv."""
    sweep_dir = Path(sweep_dir)
    found = set()
    for marker in (HYDRA, SUMMARY, METRICS):
        for p in sweep_dir.rglob(marker):
            rel = p.parent.relative_to(sweep_dir).parts
            if rel and not any(part.startswith(".") or part in (FIGURES, WANDB) for part in rel):
                found.add(p.parent)
    return sorted(found)


def crashed_jobs(sweep_dir: Path) -> list[tuple[Path, str]]:
    """(job dir, why) for each job that crashed unexpectedly: no summary.json at all (the job
    died, or its config was rejected), or status error that the experiment did not expect."""
    out = []
    for d in job_dirs(sweep_dir):
        path = d / SUMMARY
        if (d / SKIPPED).exists():  # no text version: skipped, listed by finish_multirun
            continue
        if (d / REJECTED).exists():
            out.append((d, f"config rejected: {(d / REJECTED).read_text().strip()}"))
            continue
        if not path.exists():
            out.append((d, "no summary.json (the job crashed; see its log)"))
            continue
        try:
            s = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            out.append((d, f"unreadable summary.json: {e}"))
            continue
        if s.get("status") == "error" and not s.get("expected_error"):
            out.append((d, f"status error: {s.get('error')}"))
    return out


def print_rates(sweep_dir: Path) -> None:
    """One line per experiment of the sweep: k of n seeds reproduced, and the control's rate."""
    from experiments.report import load_runs
    from experiments.report.sections.catalogue import rate_lines
    for line in rate_lines(load_runs([sweep_dir])):
        print(f"verdict: {line}", flush=True)


def finish_multirun(sweep_dir: Path) -> int:
    """Write the report into the sweep dir, print each experiment's rate and one line per crash;
    the exit code to use (crashes only)."""
    from experiments.report import build
    sweep_dir = Path(sweep_dir)
    for step in (lambda: print(f"report: {build([sweep_dir], sweep_dir)}", flush=True),
                 lambda: print_rates(sweep_dir)):
        try:
            step()
        except Exception:  # noqa: BLE001  the runs are on disk; a broken report is said, with its traceback and
            # the command to rerun, and must not hide them
            traceback.print_exc()
            print(f"report: failed; rerun `python -m experiments.report {sweep_dir}`", file=sys.stderr)
    for d in job_dirs(sweep_dir):
        if (d / SKIPPED).exists():
            print(f"skipped: {d.name}: {(d / SKIPPED).read_text().strip()}", flush=True)
    crashed = crashed_jobs(sweep_dir)
    for d, why in crashed:
        print(f"crashed: {d.name}: {why}", file=sys.stderr)
    if crashed:
        print(f"{len(crashed)} of {len(job_dirs(sweep_dir))} jobs crashed unexpectedly", file=sys.stderr)
    return 1 if crashed else 0


class ReportCallback(Callback):
    def on_multirun_end(self, config, **kwargs) -> None:
        code = finish_multirun(Path(config.hydra.sweep.dir))
        if code:
            sys.exit(code)
