"""Entry point: compose -> train the experiment (and its control) -> verdict -> write.

    python run.py                      # the baseline on the copy task
    python run.py +exp=no_scaling      # one failure, reproduced next to its control
    python run.py -m '+exp=glob(*)'    # the catalogue, one report at the end
"""
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from experiments.preflight import check_argv
from experiments.progress import progress_factory
from experiments.runner import exit_code, fail, run_experiment, verdict_line
from experiments.train import Preempted

os.environ.setdefault("WANDB_SILENT", "true")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> int:
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    container = OmegaConf.to_container(cfg, resolve=True)
    try:
        summary = run_experiment(container, run_dir, progress_factory)
    except Preempted as e:  # SIGTERM/USR2: the checkpoint is written; a rerun resumes from it
        print(f"preempted: {e}; rerun the same command to resume", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(143)  # at once, leaving no job result behind (a requeued job writes it)
    except ValueError as e:  # a bad config: one line, exit 2, nothing recorded as run
        if hc.mode.name == "MULTIRUN":
            print(f"error: [{cfg.exp.name}] {e}", file=sys.stderr)
            return 2
        fail(str(e))
    print(verdict_line(summary, run_dir), flush=True)
    code = exit_code(summary)
    if code and hc.mode.name != "MULTIRUN":
        sys.exit(code)
    return code


if __name__ == "__main__":
    check_argv(sys.argv[1:], Path(__file__).parent / "conf")
    main()
