"""Entry point: compose -> preflight -> train the experiment (and its control) -> verdict; then
curves.png (the report's figure) and the process's exit code, which belong here, not to the trainer.

    python run.py                      # the baseline on the copy task
    python run.py +exp=no_scaling      # one failure, reproduced next to its control
    python run.py -m '+exp=glob(*)'    # the catalogue, one report at the end
    python run.py +exp=no_scaling data=shakespeare_char   # its text version (experiments/on_text.py)
"""
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf

from experiments.command_line import (
    BadCommandLine,
    exclude_sweep_presets,
    hydra_error_line,
    remove_empty_sweeps,
    validate_command_line,
)
from experiments.config import exp_as_choice, experiment_data, replaced_by_text_model
from experiments.io import write_json, write_text
from experiments.job_log import job_log
from experiments.judging.verdict import verdict_line
from experiments.layout import CURVES, HYDRA, JOB_LOG, REJECTED, SKIPPED, SUMMARY, TRACEBACK
from experiments.on_text import NoTextVersion, reject_without_text_version
from experiments.records import RunRecord, error_message
from experiments.report.figures import draw_curves
from experiments.training.preemption import Preempted
from experiments.training.progress import progress_factory
from experiments.training.runner import preflight, run_experiment

os.environ.setdefault("WANDB_SILENT", "true")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> int:
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode.name == "MULTIRUN"
    container = OmegaConf.to_container(cfg, resolve=True)
    try:  # a bad config: one line, exit 2, nothing recorded as run
        reject_without_text_version(container, lambda: experiment_data(cfg.exp.name))
        preflight(container)
    except ValueError as e:
        if multirun:  # the sweep goes on; the job dir keeps the line for the sweep's summary
            skip = isinstance(e, NoTextVersion)  # a cell of a text sweep with no text version
            print(f"{'skipped' if skip else 'error'}: [{cfg.exp.name}] {e}", file=sys.stderr)
            write_text(run_dir / (SKIPPED if skip else REJECTED), f"{e}\n")
            return 2
        remove_if_only_hydra(run_dir)
        die(str(e))
    except Exception as e:  # noqa: BLE001  a crash before training: recorded as status error, exit 1
        return crashed(e, run_dir, cfg, container, multirun)
    with job_log(run_dir / JOB_LOG, " ".join(["python run.py", *hc.overrides.task])):
        if note := replaced_by_text_model(list(hc.overrides.task), container):  # a choice overridden: said
            print(note, flush=True)
        return train_and_judge(cfg, container, run_dir, multirun)


def train_and_judge(cfg: DictConfig, container: dict, run_dir: Path, multirun: bool) -> int:
    """The run, its control and the verdict line; curves.png; the exit code."""
    try:
        record = run_experiment(container, run_dir, progress_factory, checked=True)
        draw_curves(record, run_dir / CURVES)
    except Preempted as e:  # SIGTERM/USR2: the checkpoint is written; a rerun resumes from it
        print(f"preempted: {e}; rerun the same command to resume", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(143)  # at once, leaving no job result behind (a requeued job writes it)
    except Exception as e:  # noqa: BLE001  a crash outside the trainer: recorded as status error, exit 1
        return crashed(e, run_dir, cfg, container, multirun)
    print(verdict_line(record, run_dir), flush=True)
    code = exit_code(record)
    if code:  # training raised (recorded as status error): where its traceback is
        print(f"error: [{record.exp}] {record.error} (traceback: {run_dir / TRACEBACK})", file=sys.stderr, flush=True)
    if code and not multirun:
        sys.exit(code)
    return code


def crashed(e: Exception, run_dir: Path, cfg: DictConfig, container: dict, multirun: bool) -> int:
    """An unexpected crash: recorded as status error; exit 1 (in a multirun the sweep goes on and
    its end exits 1)."""
    record_crash(e, run_dir, cfg.exp.name, cfg.seed, container)
    if not multirun:
        sys.exit(1)
    return 1


def record_crash(e: Exception, run_dir: Path, name: str, seed: int, container: dict) -> None:
    """The traceback on stderr and in the run dir (traceback.txt), summary.json's status `error`
    with the message (whatever the runner wrote before), and one line naming both."""
    tb = traceback.format_exc()
    sys.stderr.write(tb)
    msg = error_message(e)
    if not (run_dir / TRACEBACK).exists():  # the runner writes it where it caught the exception
        write_text(run_dir / TRACEBACK, tb)
    summary = run_dir / SUMMARY
    try:
        s = json.loads(summary.read_text())
    except (OSError, ValueError):
        s = RunRecord(exp=name, seed=seed, status="error", config=container).to_summary()
    if s.get("status") != "error":
        s.update(status="error", error=msg)
    write_json(summary, s)
    print(verdict_line(RunRecord.from_summary(s), run_dir), flush=True)
    print(f"error: [{name}] {msg} (traceback: {run_dir / TRACEBACK})", file=sys.stderr, flush=True)


def exit_code(record: RunRecord) -> int:
    """Non-zero only for a crash the experiment did not expect."""
    return 1 if record.status == "error" and not record.expected_error else 0


def die(msg: str, code: int = 2):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(code)


def remove_if_only_hydra(run_dir: Path):
    """Hydra made the run dir before the config was validated; a rejected config leaves no run dir."""
    if run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= {HYDRA, JOB_LOG}:
        shutil.rmtree(run_dir, ignore_errors=True)
        for parent in (run_dir.parent, run_dir.parent.parent):  # runs/<exp>/, runs/, if now empty
            if parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()


if __name__ == "__main__":
    conf, started = Path(__file__).parent / "conf", time.time()
    try:
        results_dir = validate_command_line(sys.argv[1:], conf)
    except BadCommandLine as e:
        die(str(e))
    sys.argv[1:] = exclude_sweep_presets(exp_as_choice(sys.argv[1:]), conf)  # glob(*) is the catalogue, not the sweeps
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra's errors reach us whole, to be said in one line
    try:
        main()
    except CompactHydraException as e:  # a bad override or a config that does not compose
        remove_empty_sweeps(results_dir, started)
        die(hydra_error_line(e, conf))
