"""Post-training measurements of positions and decoding, wired through `exp.measures: ["FN"]`:
rotary phases in low precision, left padding against learned absolute positions, and the KV cache
against the full-sequence forward, a sliding-window KV cache against the whole prefix. Each
FN(trainer, cfg) -> {metric: float}."""
import contextlib
import math

import torch
import torch.nn.functional as F

from attention.mha import KVCache
from attention.rotary import apply_rope, rope_phases
from data import build_task
from data.synthetic import IGNORE


@contextlib.contextmanager
def _eval(model):
    was = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was)


def _token_losses(model, b):
    logits = model(b.x, key_padding_mask=b.key_padding_mask).float()
    return F.cross_entropy(logits.transpose(1, 2), b.y.clamp(min=0), reduction="none")  # (B, T)


# -- rope_low_precision ----------------------------------------------------------------------------
def phase_error(positions: torch.Tensor, d: int, dtype: str) -> torch.Tensor:
    """(T,) the largest |phase in dtype - phase in float64| over a head's pairs, per position (rad)."""
    exact = positions.double()[:, None] * (1.0 / 10000.0 ** (torch.arange(0, d, 2).double() / d))
    return (rope_phases(positions, d, dtype).double() - exact).abs().max(-1).values


def relative_error(start: int, t: int, d: int, dtype: str, offset: int = 1, seed: int = 0) -> float:
    """The largest |q_m . k_{m-offset} - q_offset . k_0| over the window m in [start + offset, start + t),
    for one random unit q, k pair (relative to |q||k| = 1). Exact RoPE gives ~1e-6: the score depends
    on m - n only, wherever the window sits."""
    g = torch.Generator().manual_seed(seed)
    q, k = F.normalize(torch.randn(d, generator=g), dim=0), F.normalize(torch.randn(d, generator=g), dim=0)

    def scores(pos):
        qr = apply_rope(q.expand(1, 1, len(pos), d), rope_phases(pos, d, dtype))[0, 0]
        kr = apply_rope(k.expand(1, 1, len(pos), d), rope_phases(pos - offset, d, dtype))[0, 0]
        return (qr * kr).sum(-1)
    ref = scores(torch.tensor([offset]))
    return float((scores(torch.arange(start + offset, start + t)) - ref).abs().max())


# where the model's window of T tokens is placed in a long context: 0 is where it trained
WINDOW_STARTS = (0, 256, 1024, 4096)
LATE = 4096


@torch.no_grad()
def rope_precision(trainer, cfg) -> dict:
    """The same validation windows placed at positions start..start+T-1 of a long context: the
    phase error of this run's rope_dtype there, the relative-position property's error there, and
    the loss there (`loss/window@S`, every scored token; on the copy task also `loss/copy@S`, its
    copied half) with this run's phases and with the other precision's, on the same weights.
    In float32 the placement changes nothing (the scores depend on offsets only); in bfloat16 the
    positions themselves round (spacing 2 above 256, 32 above 4096)."""
    a = trainer.model.cfg.attn                 # the AttentionConfig every layer holds
    d, T = a.d_k, trainer.task.input_len
    out = {}
    for s in WINDOW_STARTS:
        out[f"rope/phase_err@{s}"] = float(phase_error(torch.arange(s, s + T), d, a.rope_dtype).max())
        out[f"rope/rel_err@{s}"] = relative_error(s, T, d, a.rope_dtype)
    own = a.rope_dtype
    for dtype in ("float32", "bfloat16"):
        a.rope_dtype = dtype  # one config object shared by every layer: swapped, then restored
        try:
            for s in (0, LATE):
                for group, loss in _window_losses(trainer, s).items():
                    out[f"loss/{group}@{s}_{dtype}_phases"] = loss
        finally:
            a.rope_dtype = own
    for s in WINDOW_STARTS:
        for group, loss in _window_losses(trainer, s).items():
            out[f"loss/{group}@{s}"] = loss
    out["loss/window_late"] = out[f"loss/window@{LATE}"]
    if f"loss/copy@{LATE}" in out:
        out["loss/copy_late"] = out[f"loss/copy@{LATE}"]
    return out


def _window_losses(trainer, start: int) -> dict:
    """Mean loss on the eval batches with the window's first token at position `start`: over every
    scored token ("window") and over the copy task's copied half ("copy", where the task has one)."""
    tot, n = {}, {}
    with _eval(trainer.model) as model:
        for i in range(trainer.tc["eval_batches"]):
            b = trainer.task.batch(i, trainer.tc["batch_size"], "val").to(trainer.device)
            logits = model(b.x, key_padding_mask=b.key_padding_mask, start=start).float()
            lt = F.cross_entropy(logits.transpose(1, 2), b.y.clamp(min=0), reduction="none")
            groups = {"window": b.y != IGNORE, **({"copy": b.groups["copy"]} if "copy" in b.groups else {})}
            for g, m in groups.items():
                tot[g] = tot.get(g, 0.0) + float(lt[m].sum())
                n[g] = n.get(g, 0) + int(m.sum())
    return {g: tot[g] / max(n[g], 1) for g in tot}


# -- left_padding_positions ------------------------------------------------------------------------
@torch.no_grad()
def padding_sides(trainer, cfg) -> dict:
    """The same validation rows, left-padded and right-padded (padded_copy, or padded lines of text),
    scored by this run's weights and position rule: scored-token loss of each (and, on the copy
    task, the copied half's), and their differences."""
    out = {}
    for side in ("left", "right"):
        task = build_task({**cfg["data"], "pad_side": side}, seed=cfg["seed"])
        tot = copy = n = nc = 0.0
        with _eval(trainer.model) as model:
            for i in range(trainer.tc["eval_batches"]):
                b = task.batch(i, trainer.tc["batch_size"], "val").to(trainer.device)
                lt = _token_losses(model, b)
                scored = b.y != IGNORE
                tot, n = tot + float(lt[scored].sum()), n + int(scored.sum())
                if "copy" in b.groups:
                    copy, nc = copy + float(lt[b.groups["copy"]].sum()), nc + int(b.groups["copy"].sum())
        out[f"pad/{side}/loss"] = tot / n
        if nc:
            out[f"pad/{side}/loss_copy"] = copy / nc
    out["pad/left_minus_right"] = out["pad/left/loss"] - out["pad/right/loss"]
    out["pad/abs_left_minus_right"] = abs(out["pad/left_minus_right"])
    if "pad/left/loss_copy" in out:
        out["pad/copy_left_minus_right"] = out["pad/left/loss_copy"] - out["pad/right/loss_copy"]
    return out


# -- causal_kv_cache -------------------------------------------------------------------------------
@torch.no_grad()
def cache_agreement(trainer, cfg, n_rows: int = 8) -> dict:
    """Incremental decoding against the full forward on validation rows: the prompt's first half
    prefilled into the KV cache, then one token per step; the max |logit difference| over every
    decoded position. Then greedy generation with and without the cache from that prompt: the
    fraction of generated tokens that differ, and of rows whose generations differ."""
    b = trainer.task.batch(0, n_rows, "val").to(trainer.device)
    x = b.x
    T = x.shape[1]
    p = T // 2                                                   # the prompt: the first half
    with _eval(trainer.model) as model:
        full = model(x).float()                                  # (B, T, V)
        cache = KVCache(model.cfg.n_layers)
        steps = [model(x[:, :p], cache=cache).float()]
        for t in range(p, T):
            steps.append(model(x[:, t:t + 1], cache=cache).float())
        inc = torch.cat(steps, dim=1)
        diff = (inc - full).abs()
        n_new = T - p
        cached = model.generate(x[:, :p], n_new, use_cache=True)[:, p:]
        uncached = model.generate(x[:, :p], n_new, use_cache=False)[:, p:]
    differ = cached != uncached
    return {"cache/max_abs_logit_diff": float(diff.max()),
            "cache/max_abs_logit_diff_prefill": float(diff[:, :p].max()),
            "cache/greedy_token_mismatch": float(differ.float().mean()),
            "cache/greedy_rows_diverged": float(differ.any(1).float().mean()),
            "cache/logit_scale": float(full.abs().max()),
            "cache/finite": float(math.isfinite(float(diff.max())))}


# -- attention_sink --------------------------------------------------------------------------------
@torch.no_grad()
def window_eviction(trainer, cfg) -> dict:
    """The sliding-window KV cache (model.attention.kv_window, kv_sinks) against the whole prefix,
    on the same weights and validation batches, by position: before the cache fills (positions
    < kv_window + kv_sinks: nothing evicted, the two agree) and after it (the first tokens have
    left, unless kept as sinks). Mean loss per scored target; window/eviction_cost is the windowed
    loss minus the whole prefix's after the cache fills. Two caches of one size compare on the
    same positions."""
    import dataclasses

    from experiments.training.loop import token_losses
    model = trainer.model
    served = model.attentions[0].cfg
    size = served.kv_window + served.kv_sinks
    # the served cache, the same cache twice as large (as many sinks, the rest recent: the setting a
    # seed's weights may need for a clear signature, conf/exp/attention_sink.yaml), and no cache;
    # each windowed loss against the whole prefix's after that cache fills
    caches = {"window": (served, size), "window_x2": (dataclasses.replace(served, kv_window=served.kv_window + size), 2 * size),
              "whole": (dataclasses.replace(served, kv_window=None), None)}
    sums = {}
    with _eval(model):
        for name, (attn_cfg, _) in caches.items():
            for a in model.attentions:
                a.cfg = attn_cfg
            for i in range(cfg["train"]["eval_batches"]):
                b = trainer.task.batch(i, cfg["train"]["batch_size"], "val").to(trainer.device)
                loss = token_losses(model(b.x, key_padding_mask=b.key_padding_mask), b)       # (B, T)
                scored = b.y != IGNORE
                for cache, (_, fills) in caches.items():
                    if fills is None or name not in (cache, "whole"):
                        continue
                    full = torch.arange(loss.shape[1], device=loss.device) >= fills          # (T,)
                    for part, sel in (("before", scored & ~full), ("after", scored & full)):
                        s, n = sums.get((name, cache, part), (0.0, 0))
                        sums[(name, cache, part)] = (s + float(loss[sel].sum()), n + int(sel.sum()))
        for a in model.attentions:
            a.cfg = served
    mean = {k: s / max(n, 1) for k, (s, n) in sums.items()}
    return {"window/loss_after_full": mean[("window", "window", "after")],
            "window/whole_prefix_after_full": mean[("whole", "window", "after")],
            "window/agreement_before_full": abs(mean[("window", "window", "before")] - mean[("whole", "window", "before")]),
            "window/eviction_cost": mean[("window", "window", "after")] - mean[("whole", "window", "after")],
            "window/eviction_cost_x2": mean[("window_x2", "window_x2", "after")] - mean[("whole", "window_x2", "after")]}
