"""Post-training measurements for the failure catalogue, wired through
`exp.measures: ["FN"]` (MEASURES in __init__.py). Each FN(trainer, cfg) -> {metric: float} is merged into the
run's final metrics, where the experiment's checks read it."""
import copy
import dataclasses
import math
import time

import torch

from attention.diagnostics import Recorder, entropy, saved_tensor_bytes
from attention.masks import fill_value
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


class _QK(Recorder):
    """Keeps every layer's q, k (as scored), boolean mask and applied weights of one forward."""

    def __init__(self):
        super().__init__(stats=False, capture_weights=True)  # weights: the explicit path
        self.scores = []

    def record(self, name, q, k, scores, weights, mask, **kw):
        self.captured.append((name, q.detach(), k.detach(), mask, weights.detach().float()))
        self.scores.append(scores.detach())  # as the softmax saw them, the mask applied


@torch.no_grad()
def _qk_forward(model, b, amp=None, masked_scores=None):
    """(logits, [(layer, q, k, mask, weights)]) of one eval forward on the explicit path;
    `masked_scores`, a list, receives each layer's scores as the softmax saw them."""
    rec = _QK()
    for a in model.attentions:
        a.recorder = rec
    try:
        with amp() if amp else torch.no_grad():
            logits = model(b.x, key_padding_mask=b.key_padding_mask)
    finally:
        for a in model.attentions:
            a.recorder = None
    layers = {a.name: a for a in model.attentions}
    if masked_scores is not None:
        masked_scores.extend(rec.scores)
    return logits, [(layers[n], q, k, m, w) for n, q, k, m, w in rec.captured]


def _with_attention(model, **fields):
    """Swap attention config fields on every layer (one shared AttentionConfig); returns the old one."""
    old = model.attentions[0].cfg
    new = dataclasses.replace(old, **fields)
    for a in model.attentions:
        a.cfg = new
    return old


@torch.no_grad()
def _losses(trainer, n_batches: int) -> dict:
    from experiments.training.loop import group_metrics, token_losses
    model, out = trainer.model, {}
    model.eval()
    for i in range(n_batches):
        b = trainer.task.batch(i, trainer.tc["batch_size"], "val").to(trainer.device)
        logits = model(b.x, key_padding_mask=b.key_padding_mask)
        for k, v in group_metrics(token_losses(logits, b), logits, b).items():
            out[k] = out.get(k, 0.0) + float(v) / n_batches
    model.train()
    return out


@torch.no_grad()
def mask_leak(trainer, cfg) -> dict:
    """A finite mask's leak: the same weights evaluated with a correct (-inf) mask (`leak/...`
    losses), the attention mass masked keys receive, and the real scores against the fill: the
    most negative visible score and the largest margin of a masked key over its row's best
    visible one (an added -1e4 loses once that margin passes 1e4)."""
    model = trainer.model
    b = trainer.task.batch(0, trainer.tc["batch_size"], "val").to(trainer.device)
    mass, min_vis, margin = [], [], []
    for layer, q, k, mask, w in _qk_forward(model, b)[1]:
        s = layer.scores(q, k).float()
        vis = mask.expand_as(s)
        mass.append(w.masked_fill(vis, 0).sum(-1).flatten())
        min_vis.append(s[vis].min())
        best_vis = s.masked_fill(~vis, float("-inf")).amax(-1)
        best_hid = s.masked_fill(vis, float("-inf")).amax(-1)
        margin.append((best_hid - best_vis)[torch.isfinite(best_hid)].max())
    mass = torch.cat(mass)
    out = {"leak/masked_mass_mean": float(mass.mean()), "leak/masked_mass_max": float(mass.max()),
           "leak/min_visible_score": float(min(min_vis)), "leak/max_hidden_margin": float(max(margin)),
           "leak/fill": float(fill_value(torch.zeros(()), model.attentions[0].cfg.mask_fill))}
    n = trainer.tc["eval_batches"]
    old = _with_attention(model, mask_fill="neg_inf", backend="explicit")
    try:
        correct = _losses(trainer, n)
    finally:
        for a in model.attentions:
            a.cfg = old
    out.update({f"leak/{k}_correct_mask": v for k, v in correct.items() if k.startswith("loss/")})
    return out


@torch.no_grad()
def first_token_loss(trainer, cfg) -> dict:
    """Loss at each sequence's first scored position (`loss/first_token`) and at the rest of its
    first half (`loss/first_half_rest`): on random tokens both are >= ln V for a causal model.
    Also the entropy of the first query's attention row in units of ln(T): 1 = uniform over
    every key, the future included (an off-by-one mask with a finite fill)."""
    from data.synthetic import IGNORE
    from experiments.training.loop import token_losses
    model, n = trainer.model, trainer.tc["eval_batches"]
    first, rest, ent = 0.0, 0.0, []
    model.eval()
    for i in range(n):
        b = trainer.task.batch(i, trainer.tc["batch_size"], "val").to(trainer.device)
        logits, layers = _qk_forward(model, b)
        per_tok = token_losses(logits, b)
        valid = b.y != IGNORE
        col = valid.float().argmax(1)                       # the first scored position per row
        at = torch.zeros_like(valid).scatter_(1, col[:, None], True)
        others = b.groups["first_half"] & valid & ~at
        first += float(per_tok[at].mean()) / n
        rest += float(per_tok[others].mean()) / n
        T = b.x.shape[1]
        for _, _, _, _, w in layers:
            row = w[torch.arange(w.shape[0]), :, col]        # (B, h, T_k): the first query's row
            ent.append(entropy(row).mean() / math.log(T))
    model.train()
    return {"loss/first_token": first, "loss/first_half_rest": rest,
            "attn/first_row_entropy_frac": float(torch.stack(ent).mean())}


def max_visible_qk(q, k, visible=None) -> float:
    """The largest q.k (signed, in float32, before any scale) over the keys each query sees
    (`visible`: True where the softmax reads the score; None: every key)."""
    s = q.float() @ k.float().transpose(-2, -1)
    if visible is not None:
        s = s.masked_fill(~visible.expand_as(s), float("-inf"))
    return float(s.max())


@torch.no_grad()
def fp16_attention(trainer, cfg) -> dict:
    """The trained weights evaluated under float16 autocast, in the run's own score order
    (`fp16/...`) and in the other one (`fp16_other/...`): the fraction of non-finite attention
    weights of each layer run alone on its float32 inputs (the attention, isolated from the rest
    of the model), and of non-finite logits of a whole float16 forward. Also, before the scale and in
    float32, max |q.k| and the largest POSITIVE q.k a query sees (`fp16/max_qk`): float16 ends at
    65504, and only a positive product past it is +inf and a NaN row; a negative one is -inf, a
    zero weight (issue 64: seed 2's largest |q.k| was negative)."""
    model = trainer.model
    b = trainer.task.batch(0, trainer.tc["batch_size"], "val").to(trainer.device)
    _, layers = _qk_forward(model, b)
    qk = max(float((q.float() @ k.float().transpose(-2, -1)).abs().max()) for _, q, k, _, _ in layers)
    out = {"fp16/max_abs_qk": qk, "fp16/max_qk": max(max_visible_qk(q, k, m) for _, q, k, m, _ in layers),
           "fp16/float16_max": float(torch.finfo(torch.float16).max)}
    inputs = _attention_inputs(trainer)
    own = model.attentions[0].cfg.upcast
    half = lambda: torch.autocast(trainer.device.type, dtype=torch.float16)  # noqa: E731
    for prefix, upcast in (("fp16", own), ("fp16_other", not own)):
        old = _with_attention(model, upcast=upcast, backend="explicit")
        try:
            with half():
                w = torch.cat([_weights(layer, args, kw, False).flatten() for layer, args, kw in inputs])
            logits, _ = _qk_forward(model, b, half)
        finally:
            for a in model.attentions:
                a.cfg = old
        out[f"{prefix}/nonfinite_weights"] = float((~torch.isfinite(w)).float().mean())
        out[f"{prefix}/nonfinite_logits"] = float((~torch.isfinite(logits.float())).float().mean())
    return out


@torch.no_grad()
def mask_combine_rows(trainer, cfg) -> dict:
    """The trained weights evaluated with the run's mask_combine (`mask16/...`) and the other one
    (`mask16_other/...`) under float16 autocast, and the run's in float32 (`mask32/...`), on the
    eval batches: the fraction of attention rows whose every score is -inf after the mask, of rows
    with NaN weights, and of non-finite logits."""
    model, n = trainer.model, trainer.tc["eval_batches"]
    own = model.attentions[0].cfg.mask_combine
    other = "logical_and" if own == "add_min" else "add_min"
    half = lambda: torch.autocast(trainer.device.type, dtype=torch.float16)  # noqa: E731
    out = {}
    for prefix, combine, amp in (("mask16", own, half), ("mask16_other", other, half), ("mask32", own, None)):
        old = _with_attention(model, mask_combine=combine, backend="explicit")
        neginf, nan, bad = [], [], []
        try:
            for i in range(n):
                b = trainer.task.batch(i, trainer.tc["batch_size"], "val").to(trainer.device)
                seen = []
                logits, layers = _qk_forward(model, b, amp, seen)
                neginf += [torch.isneginf(s).all(-1).flatten() for s in seen]
                nan += [torch.isnan(w).any(-1).flatten() for *_, w in layers]
                bad.append((~torch.isfinite(logits.float())).flatten())
        finally:
            for a in model.attentions:
                a.cfg = old
        for name, xs in (("neginf_rows", neginf), ("nan_rows", nan), ("nonfinite_logits", bad)):
            out[f"{prefix}/{name}"] = float(torch.cat(xs).float().mean())
    return out
