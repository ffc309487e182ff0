"""Judge existing runs again under changed thresholds, without training:

    python -m experiments.rejudge DIR... exp.checks.plateau.value=30 [exp.checks.NAME.FIELD=VALUE ...]

Every run under the DIRs (run dirs, a sweep dir, results/) whose experiment has a signature is
judged again from its own metrics.csv and summary.json and its control's, with the overrides
applied to its `exp` node (a check an experiment does not have is left alone there; one no run has
is an error); its summary.json gets the new verdict (and the overrides in its config), its
curves.png is drawn again from its files (the verdict panel shows the new verdict), and one
verdict line per run is printed. Then `python -m experiments.report DIR...` rebuilds the report.
The W&B run keeps the verdict it was trained with (an offline run cannot be reopened cheaply):
summary.json is the record. Bad input: one line, exit 2; a run that cannot be judged: exit 1.
"""
import copy
import sys
from pathlib import Path

import yaml

from experiments.io import write_json
from experiments.judging.checks import FIELDS, signature
from experiments.judging.verdict import RunView, evaluate, expected_error, verdict_line, with_gain
from experiments.layout import CHECKPOINTS, CURVES, SUMMARY, WANDB
from experiments.records import RunRecord
from experiments.report.figures import draw_curves
from experiments.suggest import did_you_mean

USAGE = "usage: python -m experiments.rejudge DIR... exp.checks.NAME.FIELD=VALUE ..."


def parse(argv: list[str]) -> tuple[list[Path], list[tuple[str, str, object]]]:
    """(dirs, [(check, field, value)]); ValueError (one line) on anything else."""
    dirs, overrides = [], []
    for a in argv:
        if "=" not in a:
            if not Path(a).exists():
                raise ValueError(f"{a}: no such directory")
            dirs.append(Path(a))
            continue
        key, _, text = a.partition("=")
        parts = key.lstrip("+").split(".")
        if len(parts) != 4 or parts[:2] != ["exp", "checks"]:
            raise ValueError(f"{key}: only thresholds can be judged again without training "
                             f"(exp.checks.NAME.FIELD=VALUE)")
        if parts[3] not in FIELDS:
            raise ValueError(f"{key}: {parts[3]!r} is not a check field{did_you_mean(parts[3], FIELDS)}")
        overrides.append((parts[2], parts[3], yaml.safe_load(text) if text else None))
    if not dirs:
        raise ValueError(USAGE)
    return dirs, overrides


def judged_runs(dirs: list[Path]) -> list[Path]:
    """Run dirs under `dirs` whose summary.json holds a verdict (failures and baselines)."""
    found = []
    for d in dirs:
        for p in sorted(d.rglob(SUMMARY)) if d.is_dir() else []:
            if any(part.startswith(".") or part in (WANDB, CHECKPOINTS) for part in p.relative_to(d).parts[:-1]):
                continue
            if '"verdict"' in p.read_text():
                found.append(p.parent)
    return found


def with_overrides(record: RunRecord, overrides: list) -> dict:
    """The run's exp node with the overrides of the checks it has; ValueError if one is bad."""
    spec = copy.deepcopy(record.config["exp"])
    for name, field, value in overrides:
        if name in (spec.get("checks") or {}):
            spec["checks"][name][field] = value
    try:
        signature(spec)
    except ValueError as e:
        raise ValueError(f"{record.exp}: {e}") from None
    return spec


def rejudge(run_dir: Path, record: RunRecord, spec: dict) -> RunRecord:
    """run_dir's verdict under the exp node `spec`, written into its summary.json; its curves.png
    (where run.py drew one) drawn again from the run's files, so the figure says what the summary says."""
    checks = signature(spec)
    control = crows = None
    if record.control:
        cdir = Path(record.control["dir"])
        if not (cdir / SUMMARY).exists():
            raise ValueError(f"its control {cdir} is not there (judge from the dir the run was trained in)")
        control = RunRecord.read(cdir)
        crows = control.metrics()
        if "control" in record.context:  # `control` in check expressions: the control's final loss
            control.context = {**control.context, "control": record.context["control"]}
        if record.floor and record.floor.get("status") == "completed":  # `floor` in check expressions
            control.context = {**control.context, "floor": record.floor["final"]["loss/train"]}
        control.context = with_gain(control.context, record.floor)
    record.context = with_gain(record.context, record.floor)  # `gain`: the floor minus its text model
    record.verdict = evaluate(checks, RunView.of(record, record.metrics()),
                              RunView.of(control, crows) if control else None)
    record.expected_error = expected_error(record.status, record.verdict)
    record.config = {**record.config, "exp": spec}
    write_json(run_dir / SUMMARY, record.to_summary())
    if (run_dir / CURVES).exists():
        draw_curves(RunRecord.read(run_dir), run_dir / CURVES)
    return record


def main(argv: list[str]) -> int:
    try:  # everything checked before any summary.json is written
        dirs, overrides = parse(argv)
        runs = {d: RunRecord.read(d) for d in judged_runs(dirs)}
        if not runs:
            raise ValueError(f"no judged run under {', '.join(map(str, dirs))}")
        have = {n for r in runs.values() for n in ((r.config.get("exp") or {}).get("checks") or {})}
        for name, _, _ in overrides:
            if name not in have:
                raise ValueError(f"exp.checks.{name}: no run here has this check{did_you_mean(name, have)}")
        specs = {d: with_overrides(r, overrides) for d, r in runs.items()}
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    failed = 0
    for run_dir, record in runs.items():
        try:
            print(verdict_line(rejudge(run_dir, record, specs[run_dir]), run_dir), flush=True)
        except (ValueError, KeyError, OSError) as e:
            failed += 1
            print(f"error: {run_dir}: cannot be judged again: {e}", file=sys.stderr)
    print(f"judged {len(runs) - failed} of {len(runs)} runs; the report: python -m experiments.report "
          f"{' '.join(map(str, dirs))}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
