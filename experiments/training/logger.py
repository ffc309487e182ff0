"""Metric sinks: W&B (offline unless the user says online) or nothing.

W&B sees the metrics.csv names unchanged, plus on diagnostic steps the per-head entropies as
one histogram per layer (`attn/entropy_heads/L<i>`) and, at a few steps, the attention weights
of example 0 as an image per layer (`attn/weights/L<i>`: heads side by side).
"""
import os
from pathlib import Path

import numpy as np

from experiments.config import need

N_IMAGES = 5  # attention heatmaps logged per run: step 0, the last step, and evenly between


class NullLogger:
    def log(self, metrics: dict, step: int, attn=None): ...
    def summary(self, d: dict): ...
    def finish(self, exit_code: int = 0): ...


def image_steps(steps: int, diag_every: int, n: int = N_IMAGES) -> set[int]:
    """Diagnostic steps (0, k*diag_every, the last) at which to log heatmaps: n spread evenly."""
    if not diag_every:
        return set()
    diag = sorted({*range(0, steps, diag_every), steps - 1})
    if len(diag) <= n:
        return set(diag)
    return {diag[round(i * (len(diag) - 1) / (n - 1))] for i in range(n)}


def heads_image(weights, scale: int = 4) -> np.ndarray:
    """(h, T_q, T_k) weights in [0, 1] -> uint8 RGB (T_q*scale, h*(T_k+1)*scale, 3), heads left to
    right with a white gap; NaN (a diverged softmax) shows as red."""
    from matplotlib import colormaps
    w = np.asarray(weights, dtype=np.float32)
    h, tq, tk = w.shape
    rgb = colormaps["viridis"](np.clip(np.nan_to_num(w, nan=0.0), 0, 1))[..., :3]
    rgb[np.isnan(w)] = (1.0, 0.0, 0.0)
    gap = np.ones((h, tq, 1, 3))
    row = np.concatenate(np.concatenate([rgb, gap], axis=2), axis=1)[:, :-1]  # (T_q, h*(T_k+1)-1, 3)
    row = row.repeat(scale, axis=0).repeat(scale, axis=1)
    return (row * 255).round().astype(np.uint8)


def entropy_by_layer(metrics: dict) -> dict[str, list[float]]:
    """{layer: [entropy of H0, H1, ...]} from the row's attn/entropy_head/L<i>/H<j> values."""
    out: dict[str, dict[int, float]] = {}
    for k, v in metrics.items():
        if k.startswith("attn/entropy_head/"):
            _, _, layer, head = k.split("/")
            out.setdefault(layer, {})[int(head[1:])] = v
    return {layer: [heads[h] for h in sorted(heads)] for layer, heads in sorted(out.items())}


def payload(metrics: dict, step: int, attn, log_images: bool) -> dict:
    """What one wandb.log call carries: the CSV row unchanged, plus histograms and images."""
    import wandb
    out = {**metrics, "step": step}
    for layer, values in entropy_by_layer(metrics).items():
        out[f"attn/entropy_heads/{layer}"] = wandb.Histogram(values, num_bins=min(64, max(4, len(values))))
    if attn and log_images:
        for layer, w in sorted(attn.items()):
            out[f"attn/weights/{layer}"] = wandb.Image(
                heads_image(w), caption=f"step {step}, {layer}: heads H0..H{len(w) - 1} left to right")
    return out


class WandbLogger:
    """One W&B run per training run, grouped by experiment (the control in the same group),
    tagged (failure mode, role, seed), with the whole resolved config.

    Each run is its own (`reinit="create_new"`): the failure's run stays open while its control
    and floor train in runs of their own, and only its owner finishes it, after the verdict is in
    its summary. ("finish_previous" closed the failure's run when the control's opened, and the
    verdict was then written into a finished run.)"""

    def __init__(self, logger_cfg: dict, run_dir: Path, config: dict, name: str, group: str,
                 tags: list[str]):
        import wandb
        env = os.environ.get("WANDB_MODE")
        mode = env if env in ("online", "disabled") else need(logger_cfg, "logger.mode")
        self.wandb = wandb
        # offline (the default), W&B does not save the list of installed packages with each run: it
        # is most of an offline run's CPU (0.25 of 0.36 s, each run of a sweep); online runs keep it
        self.run = wandb.init(project=need(logger_cfg, "logger.project"), entity=need(logger_cfg, "logger.entity"),
                              mode=mode, dir=str(run_dir), config=config, name=name, group=group,
                              tags=tags, reinit="create_new",
                              settings=wandb.Settings(x_save_requirements=mode == "online"))
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")  # every panel's x axis is the training step
        for key in ("loss/*", "attn/entropy/*"):
            self.run.define_metric(key, step_metric="step", summary="min,last")
        self.image_steps = image_steps(config["train"]["steps"], config["train"]["diag_every"])

    def log(self, metrics: dict, step: int, attn=None):
        """attn: on diagnostic steps, {layer: (h, T_q, T_k) weights of example 0}."""
        self.run.log(payload(metrics, step, attn, step in self.image_steps))

    def summary(self, d: dict):
        self.run.summary.update(d)

    def finish(self, exit_code: int = 0):
        """Once; a second call (an error path after a normal finish) does nothing."""
        if self.run is not None:
            self.run.finish(exit_code=exit_code)
            self.run = None


def make_logger(logger_cfg: dict, run_dir, config: dict, name: str, group: str, tags: list[str]):
    if logger_cfg["name"] == "wandb":
        return WandbLogger(logger_cfg, Path(run_dir), config, name, group, tags)
    return NullLogger()
