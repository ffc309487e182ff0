"""What a fix for exploding attention logits costs (conf/fix/, attention/logit_fixes.py), wired through
`exp.measures: ["cost_vs_no_fix"]`."""
import copy
import time

import torch

from experiments.training.build import build_model
from experiments.training.loop import mean_loss, token_losses

FIX_KEYS = {"qk_norm": False, "softcap": None, "qk_clip": None, "sigma_reparam": False}


def _no_fix_twin(trainer, cfg):
    """The same model with every fix off, built with the same seed."""
    mcfg = copy.deepcopy(cfg["model"])
    mcfg["attention"].update(FIX_KEYS)
    torch.manual_seed(cfg["seed"])
    return build_model(mcfg, trainer.task).to(trainer.device)


def _step_time(model, b) -> float:
    """One training step's work besides the optimizer's: forward, loss, backward, and QK-clip's
    rescaling where it is on (sigma-reparam's power iteration runs inside the forward)."""
    t0 = time.perf_counter()
    loss = mean_loss(token_losses(model(b.x, key_padding_mask=b.key_padding_mask), b), b)
    loss.backward()
    if model.cfg.attn.qk_clip is not None:
        for a in model.attentions:
            a.qk_clip_()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def cost_vs_no_fix(trainer, cfg, reps: int = 9) -> dict:
    """Time of a step with this run's fix against the same model without it, in one process on the
    same batch, the two interleaved so load from other processes hits both alike: the median of the
    per-pair ratios. A copy of the trained model is timed (QK-clip would rescale the weights)."""
    model, twin = copy.deepcopy(trainer.model), _no_fix_twin(trainer, cfg)
    b = trainer.task.batch(0, trainer.tc["batch_size"], "val").to(trainer.device)
    model.train(), twin.train()
    for m in (model, twin):
        _step_time(m, b)                                  # warm-up
    ratios, times, base = [], [], []
    for _ in range(reps):
        t_twin, t_run = _step_time(twin, b), _step_time(model, b)
        ratios.append(t_run / t_twin)
        times.append(t_run)
        base.append(t_twin)
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {"cost/time_ratio_vs_no_fix": med(ratios), "cost/step_ms": 1000 * med(times),
            "cost/step_ms_no_fix": 1000 * med(base)}
