"""One experiment: train the failure run, find or train its control (and on text its no-attention
floor), judge; returns the run's record. It writes the run dir's records (metrics.csv, perf.csv,
summary.json, attn_weights.npz, wandb/: experiments.layout) and nothing else: the entry point draws
curves.png (experiments.report.figures) and sets the process's exit code.
Controls live under <results_dir>/controls/<hash>/, keyed by the hash of everything that shapes
training, not by its name, so every experiment with the same control config reuses one run (a file
lock keeps two parallel jobs from training it twice). A control keeps its final weights (model.pt):
an experiment that reuses it measures on them what it measures (exp.measures) and the experiment
that trained the control did not.
"""
import copy
import json
import math
import platform
import time
import traceback
from pathlib import Path

import torch

from experiments.io import dir_lock, save_attn_weights, save_torch, write_json, write_text
from experiments.judging.checks import signature
from experiments.judging.expressions import names_used
from experiments.judging.verdict import RunView, evaluate, expected_error, with_gain
from experiments.layout import ATTN_WEIGHTS, SUMMARY, TRACEBACK, WEIGHTS, checkpoint_path, control_dir
from experiments.records import RunRecord, config_hash, error_message
from experiments.schema import validate
from experiments.training.build import reject_unbuildable
from experiments.training.checkpoint import remove_checkpoint
from experiments.training.logger import make_logger
from experiments.training.loop import Trainer, write_metrics
from experiments.training.measures import MEASURES
from experiments.training.preemption import Preempted
from experiments.training.threads import auto_threads


def measure_fn(name: str):
    """exp.measures entries are names in experiments/training/measures' MEASURES."""
    if name not in MEASURES:
        raise ValueError(f"exp.measures: no measure named {name!r} (known: {', '.join(MEASURES)})")
    return MEASURES[name]


def set_dotted(d: dict, key: str, value):
    *path, last = key.split(".")
    for p in path:
        d = d[p]
    if last not in d:
        raise ValueError(f"exp.control.overrides: unknown key {key!r}")
    d[last] = value


def derived_config(cfg: dict, name: str, overrides: dict, claim: str, measures: list) -> dict:
    """cfg with `overrides` ({dotted.key: value}) applied, for a run that judges nothing and sits in
    its experiment's W&B group: a control, or a floor."""
    c = copy.deepcopy(cfg)
    for k, v in (overrides or {}).items():
        set_dotted(c, k, v)
    c["exp"] = {**cfg["exp"], "name": name, "claim": claim, "broken": None, "control": None, "floor": None,
                "expect": [], "checks": {}, "group": cfg["exp"]["group"] or cfg["exp"]["name"], "measures": measures}
    return c


def control_config(cfg: dict) -> dict:
    """The experiment's config with the bug undone (exp.control.overrides); it measures what its
    experiment measures unless exp.control.measures says otherwise."""
    spec = cfg["exp"]
    ctrl = spec["control"]
    return derived_config(cfg, ctrl["name"], ctrl.get("overrides"), f"control of {spec['name']}",
                          ctrl["measures"] if "measures" in ctrl else spec["measures"])


def floor_config(cfg: dict) -> dict:
    """The no-attention floor (exp.floor): the control's config with exp.floor.overrides
    (model.attention.reach=self: each position attends only to itself), so its loss is what the
    LM reaches without attention. Cached under controls/ like a control."""
    spec = cfg["exp"]
    base = control_config(cfg) if spec["control"] else cfg
    return derived_config(base, spec["floor"]["name"], spec["floor"]["overrides"],
                          f"no-attention floor of {spec['name']}", [])


# the override that makes a floor a floor; the rest of exp.floor.overrides restores the text model
# where an experiment's control is not it (a high learning rate, another window)
NO_ATTENTION = "model.attention.reach"


def text_model_config(cfg: dict) -> dict:
    """The healthy text model of experiment cfg's corpus and seed: its floor with attention on (every
    floor override but NO_ATTENTION), so `floor - its loss` is what attention gains on this corpus:
    `gain` in check expressions. Where the control is the text model it is the same config (the same
    hash): the cached control, reused."""
    spec = cfg["exp"]
    base = control_config(cfg) if spec["control"] else cfg
    overrides = {k: v for k, v in spec["floor"]["overrides"].items() if k != NO_ATTENTION}
    return derived_config(base, "text_model", overrides, f"the text model of {spec['name']}", [])


def needs_text_model(checks: list[dict]) -> bool:
    """Whether some check's threshold is in units of `gain` (the text model is trained only then)."""
    return any("gain" in names_used(c.get(f)) for c in checks if c["kind"] != "status"  # a status is a word
               for f in ("value", "level", "tol"))


def preflight(cfg: dict) -> None:
    """Everything a run and its control would reject, found before either trains: a bad config
    raises ValueError (one line) here and nothing is recorded. Builds no model."""
    spec = cfg["exp"]
    checks = signature(spec)  # every check and expression parsed
    if needs_text_model(checks) and not spec["floor"]:
        raise ValueError(f"exp.checks: `gain` (attention's gain on a corpus) needs a no-attention floor "
                         f"(exp.floor: text versions); {spec['name']} has none")
    configs = [cfg] + ([control_config(cfg)] if spec["control"] else []) + ([floor_config(cfg)] if spec["floor"] else [])
    configs += [text_model_config(cfg)] if spec["floor"] and needs_text_model(checks) else []
    for c in configs:
        validate(c)  # the schema: types, ranges, choices, cross-field rules
        reject_unbuildable(c)  # what building would reject: the block size, the corpus, ...
        for ref in c["exp"]["measures"]:
            measure_fn(ref)


def _context(cfg: dict, trainer: Trainer, res) -> dict:
    V = trainer.task.vocab_size
    return {"ln_V": math.log(V), "V": V, "d_k": trainer.model.cfg.attn.d_k,
            "steps": cfg["train"]["steps"], "steps_done": res.steps_done,
            "log_every": cfg["train"]["log_every"]}


def use_threads(cfg: dict) -> str:
    """train.threads: torch's CPU threads from the run's start (auto: the cores free now; null: as
    torch or the launcher set them); returns why (summary.json's env.threads_why beside env.threads)."""
    global _threads_why
    threads, _threads_why = auto_threads(cfg["train"]["threads"])
    if threads is not None:
        torch.set_num_threads(threads)
    return _threads_why


_threads_why = None  # torch's threads are the process's: every run it trains (control, floor) ran with them


def run_env(device) -> dict:
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "threads_why": _threads_why,
            "python": platform.python_version(), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None}


def train_run(cfg: dict, run_dir: Path, role: str, progress_factory=None, keep_weights: bool = False):
    """Train one config into run_dir; returns (its RunRecord, no verdict yet; its logger, still
    open). Two jobs of one sweep with the same config (a baseline and another job's control)
    would share a checkpoint: the second waits for the first, then trains afresh, so no file has
    two writers."""
    ckpt = checkpoint_path(cfg["results_dir"], cfg["exp"]["name"], config_hash(cfg))
    with dir_lock(ckpt.parent):  # removed with its dir once the checkpoint is (the run completed)
        return _train_run(cfg, Path(run_dir), role, ckpt, progress_factory, keep_weights)


def _train_run(cfg: dict, run_dir: Path, role: str, ckpt: Path, progress_factory=None, keep_weights=False):
    progress = progress_factory(cfg) if progress_factory else None
    trainer = Trainer(cfg, run_dir, ckpt_path=ckpt, progress=progress and progress.update)
    name = cfg["exp"]["name"]
    logger = make_logger(cfg["logger"], run_dir, cfg, name=f"{name}-seed{cfg['seed']}",
                         group=cfg["exp"]["group"] or name, tags=[name, role, f"seed{cfg['seed']}"])
    trainer.log_fn = logger.log
    try:
        return _train(cfg, run_dir, role, ckpt, trainer, progress, keep_weights), logger
    except BaseException:  # preempted, or a crash outside the training loop: the W&B run is closed here
        logger.finish(exit_code=1)
        raise


def _train(cfg: dict, run_dir: Path, role: str, ckpt: Path, trainer: Trainer, progress, keep_weights=False) -> RunRecord:
    t0, c0 = time.perf_counter(), time.process_time()
    error = None
    try:
        res = trainer.run()
    except Preempted:
        write_metrics(run_dir, trainer.res)
        raise
    except Exception as e:  # noqa: BLE001  a crash is a recorded outcome (status error, its traceback), not a lost run
        res = trainer.res
        res.status, error = "error", error_message(e)
        write_text(run_dir / TRACEBACK, traceback.format_exc())
    finally:
        if progress:
            progress.close()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0  # cpu: honest on a shared box
    write_metrics(run_dir, res)
    if res.attn_weights:
        save_attn_weights(run_dir / ATTN_WEIGHTS, res.attn_weights)
    if res.status == "completed":
        for ref in cfg["exp"]["measures"]:
            res.final.update(measure_fn(ref)(trainer, cfg))
        if keep_weights:
            save_torch(run_dir / WEIGHTS, trainer.model.state_dict())
    tps = [p["perf/tokens_per_s"] for p in res.perf[1:]] or [p["perf/tokens_per_s"] for p in res.perf]
    record = RunRecord(
        exp=cfg["exp"]["name"], role=role, claim=cfg["exp"]["claim"], status=res.status, seed=cfg["seed"],
        steps_done=res.steps_done, final=res.final or (res.rows[-1] if res.rows else {}),
        nonfinite=res.nonfinite, error=error, params=res.params, config_hash=config_hash(cfg),
        device=str(trainer.device), env=run_env(trainer.device), wall_s=wall, cpu_s=cpu,
        perf={"tokens_per_s": sum(tps) / len(tps) if tps else None},
        context=_context(cfg, trainer, res), config=cfg, dir=run_dir)
    remove_checkpoint(ckpt)  # finished: a rerun starts afresh; only an interrupted run resumes
    return record


def control_key(ccfg: dict) -> str:
    """A control (or floor) is cached by what it trains, not by its name nor by what its experiment
    measures: a new experiment whose control equals a cached one reuses it, and measures on its
    saved weights what the first one did not (measure_cached)."""
    return config_hash(ccfg)


def find_or_train_control(cfg: dict, progress_factory=None, make=control_config) -> tuple[RunRecord, bool]:
    """(the control, or with make=floor_config the floor, of experiment cfg; whether it was reused
    from the cache rather than trained now). A reused one is named as this experiment names it; its
    dir keeps the name it was trained under, and trained_for the experiment that trained it."""
    ccfg = make(cfg)
    cdir = control_dir(ccfg["results_dir"], control_key(ccfg))
    with dir_lock(cdir):  # a parallel job waits here, then reuses the result
        if (cdir / SUMMARY).exists():  # maybe trained for another experiment: named as this one names it
            cached = measure_cached(RunRecord.read(cdir), ccfg)
            # trained before trained_for was recorded: its W&B group, its first experiment's name
            cached.trained_for = cached.trained_for or cached.config.get("exp", {}).get("group")
            cached.exp, cached.claim = ccfg["exp"]["name"], ccfg["exp"]["claim"]
            return cached, True
        record, logger = train_run(ccfg, cdir, role="control", progress_factory=progress_factory,
                                   keep_weights=make is not floor_config)  # a floor measures nothing
        record.trained_for = cfg["exp"]["name"]
        try:
            logger.summary({"status": record.status, **{f"final/{k}": v for k, v in record.final.items()}})
        finally:
            logger.finish()
        write_json(cdir / SUMMARY, record.to_summary())
        return record, False


def reference_entry(ref: RunRecord, of: str, reused: bool) -> dict:
    """summary.json's `control` (or `floor`): what it is (its name, as the experiment `of` names
    it), its config hash, the experiment it was trained for, and whether this run reused it."""
    return {"name": ref.exp, "of": of, "config_hash": ref.config_hash, "trained_for": ref.trained_for,
            "reused": reused, "dir": str(ref.dir), "status": ref.status, "final": ref.final}


def finished_record(cfg: dict, run_dir: Path) -> RunRecord | None:
    """The record an earlier attempt of this very job left in run_dir, if it finished with the same
    config: a resumed sweep (a fixed sweep dir, experiments/reference.py) trains it no second time.
    summary.json is the last file a run writes, so its presence means the run dir is whole; an
    unexpected error is not finished, and is retried."""
    try:
        record = RunRecord.read(run_dir)
    except (OSError, ValueError, TypeError):
        return None
    done = record.status in ("completed", "diverged") or (record.status == "error" and record.expected_error)
    return record if done and record.config == json.loads(json.dumps(cfg, default=str)) else None


def measure_cached(record: RunRecord, ccfg: dict) -> RunRecord:
    """A cached control, with what this experiment measures and the experiment that trained it did
    not: measured on its saved weights, added to its summary.json (called under its lock)."""
    done = record.config.get("exp", {}).get("measures") or []
    missing = [m for m in ccfg["exp"]["measures"] if m not in done]
    weights = record.dir / WEIGHTS
    if not missing or record.status != "completed" or not weights.exists():
        return record  # nothing to add, or nothing to measure on: its checks are not measurable
    trainer = Trainer(ccfg, record.dir)
    trainer.model.load_state_dict(torch.load(weights, map_location=trainer.device, weights_only=True))
    trainer.res.rows, trainer.res.final = record.metrics(), dict(record.final)  # what a measure may read
    trainer.res.steps_done = trainer.step = record.steps_done
    before = set(record.final)
    for ref in missing:
        record.final.update(measure_fn(ref)(trainer, ccfg))
    record.measured_later = sorted({*(record.measured_later or ()), *(set(record.final) - before)})
    record.config["exp"]["measures"] = [*done, *missing]
    write_json(record.dir / SUMMARY, record.to_summary())
    return record


def run_experiment(cfg: dict, run_dir: Path, progress_factory=None, checked: bool = False) -> RunRecord:
    """Train, judge against the control, write summary.json; returns the record.
    The run's W&B run stays open while its control and floor train (in runs of their own) and is
    closed here, on every path, after the verdict is in its summary."""
    run_dir = Path(run_dir)
    if not checked:  # run.py preflights first, so that a bad config (exit 2) is never taken for a crash
        preflight(cfg)
    use_threads(cfg)
    if (done := finished_record(cfg, run_dir)) is not None:
        return done
    record, logger = train_run(cfg, run_dir, role="failure" if cfg["exp"]["control"] else "baseline",
                               progress_factory=progress_factory)
    try:
        judge(cfg, record, progress_factory)
        write_json(run_dir / SUMMARY, record.to_summary())
        logger.summary({"status": record.status, "reproduced": record.verdict["reproduced"],
                        "verdict": record.verdict, **{f"final/{k}": v for k, v in record.final.items()}})
    except Exception as e:  # judging, the control or W&B raised: the run is an error, never `completed`
        record.status, record.error = "error", error_message(e)
        if record.verdict is not None:  # judged before the crash: a run that raised reproduces nothing
            record.verdict = {**record.verdict, "reproduced": False, "error": record.error}
        earlier = (run_dir / TRACEBACK).read_text() + "\n" if (run_dir / TRACEBACK).exists() else ""
        write_text(run_dir / TRACEBACK, earlier + traceback.format_exc())  # the training's own, if any, first
        write_json(run_dir / SUMMARY, record.to_summary())
        try:
            logger.summary({"status": "error", "error": record.error})
        finally:
            logger.finish(exit_code=1)
        raise
    logger.finish()
    return record


def judge(cfg: dict, record: RunRecord, progress_factory=None) -> None:
    """Find or train the control (and the floor); set record.control, record.floor, record.verdict."""
    spec = cfg["exp"]
    rows = record.metrics()
    control, crows = None, []
    if spec["control"]:
        control, reused = find_or_train_control(cfg, progress_factory)
        crows = control.metrics()
        record.control = {**reference_entry(control, spec["name"], reused),
                          "nonfinite": control.nonfinite, "error": control.error}
    loss = spec["loss_metric"]
    if control is not None and control.status == "completed" and loss in control.final:
        for r in (record, control):  # `control` in check expressions, for run and control alike
            r.context = {**r.context, "control": control.final[loss]}
    if spec["floor"]:  # its final loss is `floor` in check expressions, for run and control alike
        floor, reused = find_or_train_control(cfg, progress_factory, make=floor_config)
        record.floor = reference_entry(floor, spec["name"], reused)
        if floor.status == "completed":
            for r in (record, control):
                if r is not None:
                    r.context = {**r.context, "floor": floor.final["loss/train"]}
    checks = signature(spec)
    if spec["floor"] and needs_text_model(checks):  # `gain`: the floor minus the text model's loss
        model, reused = find_or_train_control(cfg, progress_factory, make=text_model_config)
        record.floor = {**record.floor, "text_model": reference_entry(model, spec["name"], reused)}
        for r in (record, control):
            if r is not None:
                r.context = with_gain(r.context, record.floor)
    record.verdict = evaluate(checks, RunView.of(record, rows), RunView.of(control, crows) if control else None)
    record.expected_error = expected_error(record.status, record.verdict)
