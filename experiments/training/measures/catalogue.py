"""Post-training measurements for the failure catalogue, wired through
`exp.measures: ["catalogue:FN"]`. Each FN(trainer, cfg) -> {metric: float} is merged into the
run's final metrics, where the experiment's checks read it."""
import copy
import time

import torch

from attention.diagnostics import Recorder, entropy, saved_tensor_bytes
from experiments.training.build import build_model


@torch.no_grad()
def _attention_inputs(trainer):
    """(layer, args, kwargs) of every attention call in an eval-mode forward of validation batch 0:
    each layer can then be rerun alone, in train or eval mode, on identical inputs."""
    model = trainer.model
    rec = Recorder(stats=False, capture_inputs=True)  # needs no weights: the layers keep their path
    b = trainer.task.batch(0, trainer.tc["batch_size"], "val").to(trainer.device)
    was_training = model.training
    model.eval()
    try:
        for a in model.attentions:
            a.recorder = rec
        model(b.x, key_padding_mask=b.key_padding_mask)
    finally:
        for a in model.attentions:
            a.recorder = None
        model.train(was_training)
    return rec.inputs


def _weights(layer, args, kw, train: bool):
    was_training = layer.training
    layer.train(train)
    try:
        _, w = layer(*args, **{**kw, "need_weights": True})
    finally:
        layer.train(was_training)
    return w.float()


@torch.no_grad()
def row_sums(trainer, cfg) -> dict:
    """Row sums of the weights as applied to V, in train mode (attention dropout on) and in eval
    mode, on the same inputs. Dropout zeroes a fraction p of the weights and rescales the rest by
    1/(1-p): rows sum to 1 only in expectation. Also measured: the zeroed fraction (~p) and the
    scale of the kept weights (exactly 1/(1-p))."""
    p = float(cfg["model"]["attention"]["dropout"])
    torch.manual_seed(cfg["seed"])
    dev_train, dev_eval, zeroed, scale, var_pred = [], [], [], [], []
    for layer, args, kw in _attention_inputs(trainer):
        w_eval, w_train = _weights(layer, args, kw, False), _weights(layer, args, kw, True)
        live = w_eval.sum(-1) > 0.5                       # rows that see at least one key
        dev_eval.append((w_eval.sum(-1) - 1).abs()[live])
        dev_train.append((w_train.sum(-1) - 1).abs()[live])
        # each weight is kept as w / (1-p) with probability 1-p: Var(row sum) = p/(1-p) sum_j w_j^2
        var_pred.append((p / (1 - p) * w_eval.pow(2).sum(-1))[live])
        pos = w_eval > 1e-6                               # weights dropout could zero
        zeroed.append((w_train[pos] == 0).float())
        kept = pos & (w_train > 0)
        scale.append(w_train[kept] / w_eval[kept])
    dev_train, dev_eval = torch.cat(dev_train), torch.cat(dev_eval)
    return {"rowsum/train_mean_dev": float(dev_train.mean()), "rowsum/train_max_dev": float(dev_train.max()),
            "rowsum/train_rms_dev": float(dev_train.pow(2).mean().sqrt()),
            "rowsum/pred_rms_dev": float(torch.cat(var_pred).mean().sqrt()),
            "rowsum/eval_mean_dev": float(dev_eval.mean()), "rowsum/eval_max_dev": float(dev_eval.max()),
            "dropout/zeroed_fraction": float(torch.cat(zeroed).mean()),
            "dropout/kept_scale": float(torch.cat(scale).mean()) if p > 0 else 1.0,
            "dropout/p": p, "dropout/inv_keep": 1.0 / (1.0 - p)}


@torch.no_grad()
def entropy_vs_uniform(trainer, cfg) -> dict:
    """Mean row entropy / mean ln(number of visible keys), per layer and the minimum over layers:
    1 = every row uniform over what it may see, 0 = one-hot. The copy task needs one layer near 0."""
    out = {}
    for layer, args, kw in _attention_inputs(trainer):
        w = _weights(layer, args, kw, False)
        visible = (w > 0).sum(-1).float()                 # causal + padding: keys each row may see
        live = visible > 1
        frac = entropy(w)[live].mean() / visible[live].log().mean()
        out[f"attn/entropy_frac_uniform/{layer.name}"] = float(frac)
    out["attn/entropy_frac_uniform"] = min(out.values())
    return out


def _dot_twin(trainer, cfg):
    """The same model with plain dot-product scores, built with the same seed."""
    mcfg = copy.deepcopy(cfg["model"])
    mcfg["attention"]["score"] = "dot"
    torch.manual_seed(cfg["seed"])
    return build_model(mcfg, trainer.task).to(trainer.device)


def _saved_bytes(model, b) -> int:
    """Bytes autograd saves for backward in one forward: the activation memory of a step."""
    _, saved = saved_tensor_bytes(lambda: model(b.x, key_padding_mask=b.key_padding_mask), model.parameters())
    return saved["total"]


def _step_time(model, b) -> float:
    t0 = time.perf_counter()
    logits = model(b.x, key_padding_mask=b.key_padding_mask)
    logits.float().logsumexp(-1).mean().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def cost_vs_dot(trainer, cfg, reps: int = 7) -> dict:
    """This run's scoring function against dot-product, measured in one process on the same
    batch: time of a forward+backward (median of per-pair ratios, the two models interleaved so
    load from other processes hits both alike), activation bytes saved for backward, and the
    parameters the scoring adds."""
    model, dot = trainer.model, _dot_twin(trainer, cfg)
    b = trainer.task.batch(0, trainer.tc["batch_size"], "val").to(trainer.device)
    model.train(), dot.train()
    for m in (model, dot):
        _step_time(m, b)                                  # warm-up
    ratios, times = [], []
    for _ in range(reps):
        t_dot, t_run = _step_time(dot, b), _step_time(model, b)
        ratios.append(t_run / t_dot)
        times.append(t_run)
    mem_run, mem_dot = _saved_bytes(model, b), _saved_bytes(dot, b)
    n_run, n_dot = (sum(p.numel() for p in m.parameters()) for m in (model, dot))
    attn_dot = sum(p.numel() for a in dot.attentions for p in a.parameters())
    return {"cost/time_ratio_vs_dot": sorted(ratios)[len(ratios) // 2],
            "cost/step_ms": 1000 * sorted(times)[len(times) // 2],
            "cost/act_bytes": float(mem_run), "cost/act_mem_ratio_vs_dot": mem_run / mem_dot,
            "params/extra_vs_dot": float(n_run - n_dot),
            "params/extra_fraction_of_attention": (n_run - n_dot) / attn_dot}
