"""Rank collapse (Dong, Cordonnier, Loukas 2021, arXiv 2103.03404): how close each layer's token
representations X (T, d) are to rank 1 of the form 1 x^T, at init and after training.

res(X) = ||X - 1 x^T||_F / ||X||_F with x the mean over tokens (the minimiser in Frobenius norm;
the paper uses a composite l1/l_inf norm, whose minimiser has no closed form). Depth 0 is the
embeddings, depth i the output of block i. Wired as `exp.measures: ["rank_residuals"]`."""
import random

import torch

from data import build_task
from experiments.training.build import build_model


def rank1_residual(x: torch.Tensor) -> torch.Tensor:
    """x (..., T, d) -> (...,): relative Frobenius distance from the best 1 x^T approximation."""
    x = x.float()
    centred = x - x.mean(dim=-2, keepdim=True)
    return centred.flatten(-2).norm(dim=-1) / x.flatten(-2).norm(dim=-1).clamp_min(1e-30)


@torch.no_grad()
def layer_residuals(model, x: torch.Tensor) -> list[float]:
    """Mean res over the batch of the embeddings and of every block's output, for tokens x (B, T)."""
    outs = []
    hooks = [b.register_forward_hook(lambda m, i, o: outs.append(o)) for b in model.blocks]
    was_training = model.training
    model.eval()
    try:
        T = x.shape[1]
        emb = model.tok_emb(x) + model.pos_emb(torch.arange(T, device=x.device))
        model(x)
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    return [float(rank1_residual(o).mean()) for o in [emb, *outs]]


def _init_model(trainer, cfg):
    """The run's model as it was at step 0: the trainer's seeding order, replayed."""
    torch.manual_seed(cfg["seed"])
    random.seed(cfg["seed"])
    build_task(cfg["data"], seed=cfg["seed"])
    return build_model(cfg["model"], trainer.task).to(trainer.device)


def rank_residuals(trainer, cfg) -> dict:
    """rank/init/depthI and rank/trained/depthI on validation batch 0, I = 0 .. n_layers."""
    x = trainer.task.batch(0, trainer.tc["batch_size"], "val").x.to(trainer.device)
    out = {}
    for when, model in (("init", _init_model(trainer, cfg)), ("trained", trainer.model)):
        res = layer_residuals(model, x)
        for i, r in enumerate(res):
            out[f"rank/{when}/depth{i}"] = r
        out[f"rank/{when}/last"] = res[-1]  # the sweep's depths compared on one key
    return out
