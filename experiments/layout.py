"""Where things lie: the names of what a run dir holds and of the results dir's folders. Every
module that writes or reads a run dir takes its file names from here."""
from pathlib import Path

# a run dir
SUMMARY = "summary.json"          # the run's record (experiments.records.RunRecord)
METRICS = "metrics.csv"           # one row per logged step
PERF = "perf.csv"                 # tokens/s per logged step
CURVES = "curves.png"             # failure against control (drawn by the entry point, report.figures)
ATTN_WEIGHTS = "attn_weights.npz" # the attention weights of one example per diagnostic step
WANDB = "wandb"                   # the W&B run's folder
HYDRA = ".hydra"                  # Hydra's record of the composed config
JOB_LOG = "run.log"               # what the run printed (experiments/job_log.py), and Hydra's log
REJECTED = "rejected.txt"         # a job of a sweep whose config was rejected: its one line, not a run
SKIPPED = "skipped.txt"           # a cell of a text sweep with no text version: its one line, not a crash
TRACEBACK = "traceback.txt"       # in a run dir whose training or job raised: the whole traceback
LOCK = ".lock"                    # held while a control or checkpoint dir is being trained into
CHECKPOINT = "ckpt.pt"
WEIGHTS = "model.pt"              # a control's final weights: an experiment reusing it measures on them

# the results dir
RUNS, MULTIRUN, CONTROLS, CHECKPOINTS, FIGURES = "runs", "multirun", "controls", "checkpoints", "figures"


def control_dir(results_dir, key: str) -> Path:
    """A control's (or a floor's) run dir: one per config (its key), shared by every experiment
    that needs it, whatever it calls it."""
    return Path(results_dir) / CONTROLS / key


def checkpoint_path(results_dir, name: str, config_hash: str) -> Path:
    """Keyed by what is trained, not by the run dir: rerunning the same command resumes."""
    return Path(results_dir) / CHECKPOINTS / f"{name}-{config_hash}" / CHECKPOINT
