"""Metric sinks: W&B (offline unless the user says online) or nothing."""
import os
from pathlib import Path


class NullLogger:
    def log(self, metrics: dict, step: int, attn=None): ...
    def summary(self, d: dict): ...
    def finish(self): ...


class WandbLogger:
    """One W&B run per training run, grouped by experiment (the control in the same group)."""

    def __init__(self, logger_cfg: dict, run_dir: Path, config: dict, name: str, group: str,
                 tags: list[str]):
        import wandb
        env = os.environ.get("WANDB_MODE")
        mode = env if env in ("online", "disabled") else logger_cfg.get("mode", "offline")
        self.wandb = wandb
        self.run = wandb.init(project=logger_cfg.get("project"), entity=logger_cfg.get("entity"),
                              mode=mode, dir=str(run_dir), config=config, name=name, group=group,
                              tags=tags, reinit="finish_previous")
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, metrics: dict, step: int, attn=None):
        """attn: on diagnostic steps, {layer: (h, T_q, T_k) weights of example 0}."""
        self.run.log({**metrics, "step": step})

    def summary(self, d: dict):
        self.run.summary.update(d)

    def finish(self):
        self.run.finish()


def make_logger(logger_cfg: dict, run_dir, config: dict, name: str, group: str, tags: list[str]):
    if logger_cfg.get("name") == "wandb":
        return WandbLogger(logger_cfg, Path(run_dir), config, name, group, tags)
    if logger_cfg.get("name") == "none":
        return NullLogger()
    raise ValueError(f"logger={logger_cfg.get('name')!r} is not one of wandb, none")
