"""Post-training measurements for the heads / d_v / KV-sharing experiments.

Each `fn(trainer, cfg) -> {metric: value}` is wired through `exp.measures` and merged into the
run's final metrics, where `exp.expect` checks and the report section read them.
"""
import math
import time

import torch

from attention.diagnostics import Recorder, kv_cache_bytes
from attention.mha import KVCache
from experiments.facts import MIXES, READS_FACTS


@torch.no_grad()
def _query_weights(trainer, n_batches: int):
    """Attention weights of the query (last) position (N, layers, h, T_k) and fact masks (N, 2, T)."""
    model, task = trainer.model, trainer.task
    model.eval()
    ws, pos = [], []
    for i in range(n_batches):
        b = task.batch(i, trainer.tc["batch_size"], "val")
        x = b.x.to(trainer.device)
        rec = Recorder(stats=False, capture_weights=True)  # every layer on the explicit path
        try:
            for a in model.attentions:
                a.recorder = rec
            model(x)
        finally:
            for a in model.attentions:
                a.recorder = None
        ws.append(torch.stack([w[:, :, -1].float().cpu() for _, w in rec.captured], 1))
        pos.append(task.fact_masks(b.x))
    model.train()
    return torch.cat(ws), torch.cat(pos)


def fact_weights(trainer, cfg) -> dict:
    """Where the query looks in the first (interference) layer, per example and head (two_facts).

    attn/fact_a, attn/fact_b: per example, the weight on fact a (all its copies) of the head that
    looks at a most, likewise b, averaged; for h = 1 that is the one head's split.
    attn/split: fraction of (example, head) pairs, among heads with >= READS_FACTS of their weight
    on facts, that put >= MIXES on each fact (experiments.facts): heads that average the two.
    attn/separated: fraction of examples where one head puts > 1/2 on a and another > 1/2 on b."""
    w, facts = _query_weights(trainer, cfg["train"]["eval_batches"])
    f = torch.einsum("nht,nft->nhf", w[:, 0], facts.float())  # (N, h, 2): weight on a, on b
    best = f.max(1).values                                    # (N, 2)
    fact_heads = f.sum(-1) >= READS_FACTS
    mixing = (f >= MIXES).all(-1) & fact_heads
    return {"attn/fact_a": float(best[:, 0].mean()), "attn/fact_b": float(best[:, 1].mean()),
            "attn/split": float(mixing.sum() / fact_heads.sum().clamp_min(1)),
            "attn/separated": float((best > 0.5).all(-1).float().mean()),
            "acc/average_ceiling": trainer.task.average_ceiling,
            "acc/answer_above_average": trainer.res.final["acc/answer"] - trainer.task.average_ceiling}


def attention_params_formula(d_model: int, h: int, h_kv: int, d_k: int, d_v: int, bias: bool) -> int:
    """W_q, W_k, W_v, W_o of one layer: 4 d_model^2 (+ 4 d_model biases) when h d_k = h d_v = d_model."""
    b = int(bias)
    return ((d_model + b) * h * d_k + (d_model + b) * h_kv * d_k + (d_model + b) * h_kv * d_v
            + (h * d_v + b) * d_model)


def param_accounting(trainer, cfg) -> dict:
    """Attention parameters counted from the tensors beside the formula, and the width W_o reads
    (h d_v, measured from its input on a forward pass)."""
    model = trainer.model
    a = model.cfg.attn
    widths = []
    hooks = [m.W_o.register_forward_hook(lambda mod, inp, out: widths.append(inp[0].shape[-1]))
             for m in model.attentions]
    with torch.no_grad():
        model(trainer.task.batch(0, 1, "val").x.to(trainer.device))
    for hk in hooks:
        hk.remove()
    L, d = model.cfg.n_layers, a.d_model
    return {"params/attention": sum(p.numel() for m in model.attentions for p in m.parameters()),
            "params/attention_formula": L * attention_params_formula(
                d, a.n_heads, a.n_kv_heads, a.d_k, a.d_v, a.bias),
            "params/attention_4d2": L * (4 * d * d + 4 * d * int(a.bias)),
            "params/total": sum(p.numel() for p in model.parameters()),
            "attn/merged_width": widths[0], "attn/merged_width_formula": a.n_heads * a.d_v,
            "attn/dv_dk_log2_gap": abs(math.log2(a.d_v / a.d_k))}


@torch.no_grad()
def _decode_ms_per_token(model, prompt, n_new: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):  # the fastest repeat: the least disturbed by other processes
        t0 = time.perf_counter()
        model.generate(prompt, n_new)
        best = min(best, time.perf_counter() - t0)
    return 1e3 * best / n_new


def kv_cache(trainer, cfg) -> dict:
    """KV-cache bytes for a full context, measured from the cache tensors, beside the formula;
    MHA's bytes for the same model; decode time per token with the cache, timed against an
    MHA twin in this process (a ratio survives a busy machine, absolute times do not)."""
    from attention import ModelConfig, TransformerLM
    model = trainer.model.eval()
    a, L = model.cfg.attn, model.cfg.n_layers
    T = model.cfg.block_size
    x = trainer.task.batch(0, 1, "val").x[:, :T].to(trainer.device)
    cache = KVCache(L)
    model(x, cache=cache)
    t = cache.length
    elt = cache.k[0].element_size()
    out = {"kv/bytes": cache.nbytes(),
           "kv/bytes_formula": kv_cache_bytes(L, a.n_kv_heads, a.d_k, t, elt, d_v=a.d_v),
           "kv/bytes_mha": kv_cache_bytes(L, a.n_heads, a.d_k, t, elt, d_v=a.d_v),
           "kv/context": t}
    out["kv/mha_over_this"] = out["kv/bytes_mha"] / out["kv/bytes"]
    out["kv/mha_over_this_predicted"] = a.n_heads / a.n_kv_heads
    mc = cfg["model"]
    twin_cfg = {**mc, "vocab_size": trainer.task.vocab_size, "n_kv_heads": None}
    twin = TransformerLM(ModelConfig.from_dict(twin_cfg)).to(trainer.device).eval()
    prompt, n_new = x[:, : max(1, T // 4)], T - max(1, T // 4)
    mine, mha = [], []
    for _ in range(3):  # interleaved, so both see the same machine load
        mine.append(_decode_ms_per_token(model, prompt, n_new, 2))
        mha.append(_decode_ms_per_token(twin, prompt, n_new, 2))
    out["decode/ms_per_token"], out["decode/ms_per_token_mha"] = min(mine), min(mha)
    out["decode/time_vs_mha"] = min(mine) / min(mha)
    model.train()
    return out
