"""One experiment: train the failure run, find or train its control, judge, write the run dir.

Run dir: metrics.csv, perf.csv, summary.json, curves.png, attn_weights.npz, wandb/.
Controls live under <results_dir>/controls/<name>-<hash>/, keyed by the hash of everything that
shapes training, so every experiment with the same control config reuses one run (a file lock
keeps two parallel jobs from training it twice).
"""
import copy
import fcntl
import hashlib
import importlib
import json
import math
import sys
import time
from pathlib import Path

import pandas as pd

from experiments.figures import plot_experiment
from experiments.io import load_attn_weights, read_rows_csv, save_attn_weights, write_json
from experiments.logger import make_logger
from experiments.schema import validate
from experiments.train import Preempted, Trainer, remove_checkpoint, write_metrics
from experiments.verdict import RunView, evaluate, validate_checks

# keys that do not change what is trained
NOT_HASHED = ("exp", "logger", "results_dir")
NOT_HASHED_TRAIN = ("progress", "ckpt_every")


def run_measure(ref: str, trainer: Trainer, cfg: dict) -> dict:
    """exp.measures entries are "module:function" references; each takes the trained Trainer
    and the config and returns {metric: value} merged into the run's final metrics, where
    checks can read them (KV-cache bytes, decode time, time per step, ...)."""
    module, _, fn = ref.partition(":")
    return importlib.import_module(module).__dict__[fn](trainer, cfg)


def config_hash(cfg: dict) -> str:
    c = {k: v for k, v in cfg.items() if k not in NOT_HASHED}
    c["train"] = {k: v for k, v in c["train"].items() if k not in NOT_HASHED_TRAIN}
    return hashlib.sha256(json.dumps(c, sort_keys=True).encode()).hexdigest()[:12]


def set_dotted(d: dict, key: str, value):
    *path, last = key.split(".")
    for p in path:
        d = d[p]
    if last not in d:
        raise ValueError(f"exp.control.overrides: unknown key {key!r}")
    d[last] = value


def control_config(cfg: dict) -> dict:
    ctrl = cfg["exp"]["control"]
    c = copy.deepcopy(cfg)
    for k, v in (ctrl.get("overrides") or {}).items():
        set_dotted(c, k, v)
    c["exp"] = {"name": ctrl.get("name", "control"), "claim": f"control of {cfg['exp']['name']}",
                "control": None, "expect": [],
                "group": cfg["exp"].get("group") or cfg["exp"]["name"],  # W&B: beside its failure
                "measures": ctrl.get("measures") or []}  # opt-in: measured on the control too
    return c


def _context(cfg: dict, trainer: Trainer, res) -> dict:
    V = trainer.task.vocab_size
    return {"ln_V": math.log(V), "V": V, "d_k": trainer.model.cfg.attn.d_k,
            "steps": cfg["train"]["steps"], "steps_done": res.steps_done,
            "log_every": cfg["train"]["log_every"]}


def build_trainer(cfg: dict, run_dir: Path, ckpt_path=None, log_fn=None, progress=None) -> Trainer:
    """Raises ValueError on a bad config: nothing is trained, nothing recorded."""
    validate_checks(cfg["exp"].get("expect"))
    return Trainer(cfg, run_dir, ckpt_path=ckpt_path, log_fn=log_fn, progress=progress)


def checkpoint_path(cfg: dict) -> Path:
    """Keyed by what is trained, not by the run dir: rerunning the same command resumes."""
    return Path(cfg["results_dir"]) / "checkpoints" / f"{cfg['exp']['name']}-{config_hash(cfg)}" / "ckpt.pt"


def train_run(cfg: dict, run_dir: Path, role: str, progress_factory=None) -> dict:
    """Train one config into run_dir; returns a summary dict (no verdict yet). Two jobs of one
    sweep with the same config (a baseline and another job's control) would share a checkpoint:
    the second waits for the first, then trains afresh, so no file has two writers."""
    ckpt = checkpoint_path(cfg)
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    with open(ckpt.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _train_run(cfg, run_dir, role, ckpt, progress_factory)


def _train_run(cfg: dict, run_dir: Path, role: str, ckpt: Path, progress_factory=None) -> dict:
    run_dir = Path(run_dir)
    h = config_hash(cfg)
    progress = progress_factory(cfg) if progress_factory else None
    trainer = build_trainer(cfg, run_dir, ckpt_path=ckpt, progress=progress and progress.update)
    name = cfg["exp"]["name"]
    group = cfg["exp"].get("group") or name
    logger = make_logger(cfg["logger"], run_dir, cfg, name=f"{name}-seed{cfg['seed']}", group=group,
                         tags=[name, role, f"seed{cfg['seed']}"])
    trainer.log_fn = logger.log
    t0, c0 = time.perf_counter(), time.process_time()
    error = None
    try:
        res = trainer.run()
    except Preempted:
        write_metrics(run_dir, trainer.res)
        logger.finish()
        raise
    except Exception as e:  # a crash is a recorded outcome (status error), not a lost run
        res = trainer.res
        res.status, error = "error", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        if progress:
            progress.close()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0  # cpu: honest on a shared box
    write_metrics(run_dir, res)
    if res.attn_weights:
        save_attn_weights(run_dir / "attn_weights.npz", res.attn_weights)
    if res.status == "completed":
        for ref in cfg["exp"].get("measures") or []:
            res.final.update(run_measure(ref, trainer, cfg))
    tps = [p["perf/tokens_per_s"] for p in res.perf[1:]] or [p["perf/tokens_per_s"] for p in res.perf]
    summary = {
        "exp": name, "role": role, "claim": cfg["exp"].get("claim"), "status": res.status,
        "seed": cfg["seed"], "steps_done": res.steps_done, "final": res.final or (res.rows[-1] if res.rows else {}),
        "nonfinite": res.nonfinite, "error": error, "params": res.params, "config_hash": h,
        "device": str(trainer.device), "wall_s": wall, "cpu_s": cpu,
        "perf": {"tokens_per_s": sum(tps) / len(tps) if tps else None},
        "context": _context(cfg, trainer, res), "config": cfg,
    }
    remove_checkpoint(ckpt)  # finished: a rerun starts afresh; only an interrupted run resumes
    summary["_logger"] = logger
    return summary


def logged_rows(run_dir: Path) -> list[dict]:
    p = Path(run_dir) / "metrics.csv"
    return read_rows_csv(p) if p.exists() else []


def view(summary: dict, rows: list[dict]) -> RunView:
    return RunView(status=summary["status"], rows=rows, final=summary["final"] if summary["status"] == "completed" else {},
                   nonfinite=summary.get("nonfinite"), error=summary.get("error"), context=summary["context"])


def find_or_train_control(cfg: dict, progress_factory=None) -> tuple[dict, list[dict], Path]:
    ccfg = control_config(cfg)
    h = config_hash(ccfg)
    cdir = Path(cfg["results_dir"]) / "controls" / f"{ccfg['exp']['name']}-{h}"
    cdir.mkdir(parents=True, exist_ok=True)
    with open(cdir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a parallel job waits here, then reuses the result
        summary_path = cdir / "summary.json"
        if summary_path.exists():
            summary = json.loads(summary_path.read_text())
            return summary, logged_rows(cdir), cdir
        summary = train_run(ccfg, cdir, role="control", progress_factory=progress_factory)
        logger = summary.pop("_logger")
        logger.summary({"status": summary["status"], **{f"final/{k}": v for k, v in summary["final"].items()}})
        logger.finish()
        write_json(summary_path, summary)
        return summary, logged_rows(cdir), cdir


def preflight(cfg: dict) -> None:
    """Check a run and its control against the schema, then build what they need, train nothing:
    a bad config raises ValueError here, before any run is recorded."""
    validate(cfg)
    if cfg["exp"].get("control"):
        validate(control_config(cfg))
    build_trainer(cfg, Path(cfg["results_dir"]))
    if cfg["exp"].get("control"):
        build_trainer(control_config(cfg), Path(cfg["results_dir"]))


def _weights(run_dir: Path):
    p = Path(run_dir) / "attn_weights.npz"
    return load_attn_weights(p) if p.exists() else None


def run_experiment(cfg: dict, run_dir: Path, progress_factory=None) -> dict:
    """Train, judge against the control, write summary.json and curves.png; returns the summary."""
    run_dir = Path(run_dir)
    preflight(cfg)
    summary = train_run(cfg, run_dir, role="failure" if cfg["exp"].get("control") else "baseline",
                        progress_factory=progress_factory)
    logger = summary.pop("_logger")
    rows = logged_rows(run_dir)
    control = None
    if cfg["exp"].get("control"):
        csum, crows, cdir = find_or_train_control(cfg, progress_factory)
        control = (view(csum, crows), crows)
        summary["control"] = {"name": csum["exp"], "dir": str(cdir), "status": csum["status"],
                              "final": csum["final"], "config_hash": csum["config_hash"],
                              "nonfinite": csum.get("nonfinite"), "error": csum.get("error")}
    summary["verdict"] = evaluate(cfg["exp"].get("expect"), view(summary, rows),
                                  control[0] if control else None)
    summary["expected_error"] = any(c.get("kind") == "status" and c.get("value") == "error"
                                    for c in cfg["exp"].get("expect") or [])
    name = cfg["exp"]["name"]
    controls = [(summary["control"]["name"], pd.DataFrame(control[1]), _weights(cdir))] if control else []
    plot_experiment(run_dir / "curves.png", name, [(name, pd.DataFrame(rows), _weights(run_dir))], controls,
                    control_name=controls[0][0] if controls else "control",
                    loss_metric=cfg["exp"].get("loss_metric", "loss/copy"), chance=summary["context"]["ln_V"])
    write_json(run_dir / "summary.json", summary)
    logger.summary({"status": summary["status"], "reproduced": summary["verdict"]["reproduced"],
                    "verdict": summary["verdict"], **{f"final/{k}": v for k, v in summary["final"].items()}})
    logger.finish()
    return summary


def verdict_line(summary: dict, run_dir) -> str:
    v = summary["verdict"]
    checks = ", ".join(f"{c['name']}={'ok' if c['passed'] else 'FAIL'}" for c in v["checks"])
    broken = " (signature also holds on the control: broken)" if v.get("signature_broken") else ""
    return (f"[{summary['exp']}] reproduced: {str(v['reproduced']).lower()}{broken} | "
            f"status {summary['status']} | {checks} | {summary['wall_s']:.1f}s | {run_dir}")


def exit_code(summary: dict) -> int:
    """Non-zero only for a crash the experiment did not expect."""
    return 1 if summary["status"] == "error" and not summary["expected_error"] else 0


def fail(msg: str, code: int = 2):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(code)
