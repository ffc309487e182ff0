"""From config to the pieces of a training: device, precision, task, model, optimizer, schedule.
Values were validated against experiments/schema.py in preflight (which names the choices:
DTYPES, OPTIMIZERS, SCHEDULES); `reject_unbuildable(cfg)` adds what only the data can tell (the
corpus, the sequence length against the block size), building no model."""
import math

import torch

from attention import ModelConfig, TransformerLM
from data import Task, build_task
from experiments.config import need


def pick_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    return torch.device(name)


def autocast_dtype(name: str, device: torch.device):
    """auto: bf16 on CUDA, none elsewhere. float16 on CPU is honoured: exp overflows above ~11.09."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return None if name == "float32" else getattr(torch, name)  # float32: no autocast


def model_config(model_cfg: dict, task: Task) -> ModelConfig:
    """The model's config for this task (vocabulary from the task); raises on a bad one."""
    d = {**model_cfg, "vocab_size": task.vocab_size}
    if task.input_len > need(model_cfg, "model.block_size"):
        raise ValueError(f"sequence length {task.input_len} exceeds model.block_size={d['block_size']}")
    return ModelConfig.from_dict(d)


def build_model(model_cfg: dict, task: Task) -> TransformerLM:
    return TransformerLM(model_config(model_cfg, task))


def optimizer_settings(optim_cfg: dict) -> tuple[str, float, dict]:
    """(name, lr, the optimizer's keyword arguments besides lr and decay)."""
    name, lr = need(optim_cfg, "optim.name"), float(need(optim_cfg, "optim.lr"))
    if name == "adamw":
        return name, lr, {"betas": tuple(need(optim_cfg, "optim.betas")), "eps": need(optim_cfg, "optim.eps")}
    return name, lr, {"momentum": need(optim_cfg, "optim.momentum")}


def build_optimizer(optim_cfg: dict, model, device):
    name, lr, kw = optimizer_settings(optim_cfg)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": optim_cfg["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    if name == "adamw":   # fused on the CPU too: 0.76 ms a step against 2.6 (nanoGPT's CPU model, 2 threads)
        return torch.optim.AdamW(groups, lr=lr, **kw, fused=device.type in ("cuda", "cpu"))
    return torch.optim.SGD(groups, lr=lr, **kw)


def lr_lambda(optim_cfg: dict, steps: int):
    """Linear warmup, then constant or cosine down to min_lr (nanoGPT's schedule)."""
    warmup = need(optim_cfg, "optim.warmup_steps")
    decay_steps = need(optim_cfg, "optim.decay_steps") or steps  # null: over the whole run
    min_ratio = need(optim_cfg, "optim.min_lr") / optim_cfg["lr"]
    schedule = need(optim_cfg, "optim.schedule")

    def f(step):
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if schedule == "constant":
            return 1.0
        t = min(1.0, (step - warmup) / max(1, decay_steps - warmup))
        return min_ratio + 0.5 * (1 + math.cos(math.pi * t)) * (1 - min_ratio)
    return f


def reject_unbuildable(cfg: dict) -> None:
    """What only the data can reject (the corpus file, its vocabulary, the sequence length
    against the block size), found without building a model or an optimizer."""
    model_config(cfg["model"], build_task(cfg["data"], seed=cfg["seed"]))
