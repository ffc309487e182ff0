"""Amplified logits: q and k scaled until the largest score reaches 1e4..1e5."""
import math
from contextlib import contextmanager

import torch

from attention_doctor.checks.common import (
    AMP_HI,
    AMP_LO,
    AMP_TARGET,
    EXACT_REL,
    HULL_REL,
    ROW_SUM_TOL,
    finite_max_abs,
    judged,
    rel,
    visible_scores,
)
from attention_doctor.layouts import scaled_sites
from attention_doctor.signals import NotPerformed, Signal


class Amplifier:
    """How to scale the scores of a target: q and k times `factor` at each verified q/k site whose
    module computes scores (`at`: their names; a linear attention's are left alone), and in the
    modules without one inside their calls (SDPA's q and k; the two inputs of the matmul whose
    output a softmax took, found in an unamplified trace)."""
    def __init__(self, ctx, factor, reached: float, at=frozenset(), in_call=frozenset(), matmuls=frozenset(),
                 after_norms=False):
        self.ctx, self.factor, self.reached = ctx, factor, reached
        self.at, self.in_call, self.matmuls = at, in_call, matmuls
        self.by_sites = bool(at)
        self.after_norms = after_norms   # inside every call: scaling the sites did not move the scores
        self.capped = False              # the scores grew with q and k, then stopped below AMP_LO: the target's cap

    @contextmanager
    def on(self, adapter):
        """Scaled scores on `adapter` (this one or a converted copy: sites are found afresh);
        yields the probe's in-call arguments."""
        sites = [s for s in self.ctx.sites(None if adapter is self.ctx.adapter else adapter) if s.name in self.at]
        with scaled_sites(sites, self.factor, self.factor):
            yield ({"qk_factor": self.factor, "qk_where": self.in_call, "qk_matmuls": self.matmuls}
                   if self.in_call else {})

    def scaled_to(self, largest: float) -> "Amplifier":
        """The same amplifier aimed at a largest score of `largest` (scores scale as factor^2)."""
        if self.capped:   # no factor takes capped scores higher: the same stress
            return self
        return Amplifier(self.ctx, self.factor * math.sqrt(largest / self.reached), largest,
                         self.at, self.in_call, self.matmuls, self.after_norms)

    def where(self) -> str:
        inside = "after what normalises q and k at their sites" if self.after_norms else "without one"
        return ", ".join(([f"at {len(self.at)} q/k site(s)"] if self.by_sites else []) +
                         ([f"inside the calls of {len(self.in_call)} module(s) {inside}"] if self.in_call else [])) + (
            "; capped there: the target's scores go no higher (a soft-cap, clipped q and k)" if self.capped else "")

    def probe(self, ctx, x, mask=None, adapter=None):
        adapter = adapter or ctx.adapter
        with self.on(adapter) as kw:
            return ctx.probe(x, mask, adapter=adapter, **kw)


FILLS = 1e30   # a score this large is a mask's fill (finfo.max, finfo.min), not a product of q and k


def amplified_visible(c, init) -> torch.Tensor:
    """The keys a traced call's amplified scores may see, given the same call at init: a mask whose
    fill no score reaches (-inf, finfo.min) read from the amplified call itself (it may move with
    the scores: top-k); one with a finite fill (-1e4) from the call at init (amplified scores pass
    below the fill)."""
    s0, s = init.scores, c.scores
    out_of_reach = ~(s0.abs() < FILLS)
    return ((init.visible | out_of_reach) & (s.abs() < FILLS)).expand_as(s)


def _max_score(calls, init=None) -> float:
    """The largest |visible score|. A softmax call's visible entries are those of the same call in
    the unamplified trace `init` (amplified scores may sit below any fill, and a softmax given
    scores minus their row maximum, as attention sinks are, has its visible entries far below 0)."""
    out = 0.0
    for i, c in enumerate(calls):
        same = init is not None and i < len(init) and init[i].source == c.source
        if same and c.source == "softmax" and init[i].scores.shape == c.scores.shape:
            s = c.scores.double().masked_select(amplified_visible(c, init[i]))
        elif same and c.source == "handmade" and init[i].visible is not None:   # q k^T (x its fitted scale)
            s = c.raw().masked_select(init[i].visible.expand_as(init[i].scores))
        else:
            s = visible_scores(c)
        out = max(out, finite_max_abs(s))
    return out


CAPPED = 4.0   # scores that grew this much with q and k before they stopped: capped by the target, not misread


def amplifier(ctx):
    """The Amplifier that brings the largest score into [AMP_LO, AMP_HI] (or as far as scores capped
    by the target go), or why not: a NotPerformed, returned (not raised) for each check that needs
    it to raise or to name a part it could not run. Computed once per target; the factor is
    verified by measuring the scores it gives."""
    if "amp" in ctx.cache:
        return ctx.cache["amp"]
    x = ctx.sample(k=30)
    _, calls = ctx.probe(x)
    m0 = _max_score(calls)
    sited = {s.name for s in ctx.sites()}
    at = frozenset(sited & {c.module for c in calls})
    unsited = {c.module for c in calls if c.module not in sited}
    in_call = frozenset(m for m in unsited if any(c.module == m and c.fused for c in calls))
    matmuls = frozenset(c.extra["qk_matmul"] for c in calls if c.module in unsited and "qk_matmul" in c.extra)
    in_call |= {m for m, _ in matmuls}
    if not calls:
        ctx.cache["amp"] = ctx.unseen("needs to see the scores (no softmax or SDPA call seen)")
        return ctx.cache["amp"]
    if m0 == 0.0:   # no factor moves a zero: a scale initialised to 0 (ZAYA's key temperature)
        ctx.cache["amp"] = NotPerformed("every visible score is 0 at init (a scale initialised to zero): no factor "
                                        "on q and k moves them", "scores_zero")
        return ctx.cache["amp"]
    if not at and not in_call:
        ctx.cache["amp"] = NotPerformed("needs q and k (no known q/k layout, no SDPA call, no q k^T before a "
                                        "softmax)", "scores_unseen")
        return ctx.cache["amp"]
    tries = [(at, in_call, matmuls, False)]
    every = frozenset(c.extra["qk_matmul"] for c in calls if "qk_matmul" in c.extra)
    inside = frozenset(c.module for c in calls if c.fused) | {n for n, _ in every}
    if at and inside:   # q and k normalised after their sites undo the stress there: scaled inside every call
        tries.append((frozenset(), inside, every, True))
    capped = None   # (largest, amplifier): scores that grew with q and k, then stopped growing
    for at, in_call, matmuls, after in tries:
        f, m, last = math.sqrt(AMP_TARGET / m0), m0, None
        for _ in range(6):
            amp = Amplifier(ctx, f, 0.0, at, in_call, matmuls, after)
            _, amped = amp.probe(ctx, x)
            m = _max_score(amped, calls)
            if AMP_LO <= m <= AMP_HI:
                amp.reached = m
                ctx.cache["amp"] = amp
                return amp
            if m <= m0 * 1.01:   # scaling q and k did not move the scores
                break
            if last is not None and m <= last * 1.01 and m < AMP_LO:   # a larger factor, the same scores: a cap
                capped = capped if capped is not None and capped[0] >= m else (m, amp)
                break
            last = m
            f *= math.sqrt(AMP_TARGET / m)
    if capped is not None and capped[0] >= CAPPED * m0:   # stressed as far as the target's scores go
        amp = capped[1]
        amp.reached, amp.capped = capped[0], True
        ctx.cache["amp"] = amp
        return amp
    ctx.cache["amp"] = NotPerformed(f"scores could not be amplified: the largest reached {m:.3g} with q and k scaled "
                                    f"by {f:.3g} (normalised or capped scores, or a q/k layout read wrong)",
                                    "not_amplified")
    return ctx.cache["amp"]


def _weights_checks(calls, init_calls):
    """(largest weight on a masked key, worst |row sum - 1|, worst hull excursion, softmax dims)."""
    masked_w, row_err, hull, dims = 0.0, None, None, set()   # None: no call whose weights are a distribution
    for i, c in enumerate(calls):
        if c.source == "softmax" and c.dim != -1 and c.q is None:
            # a softmax over another dim than the last of a tensor no q k^T fed (a mix of layers, as
            # aggregated residuals take): not attention weights. One over q k^T's queries is judged
            continue
        vis = c.visible
        if c.traced:  # masks inferred from the same call before amplification
            same = i < len(init_calls) and init_calls[i].source == c.source
            vis = None if not same else amplified_visible(c, init_calls[i]) if c.scores is not None \
                and init_calls[i].scores is not None and init_calls[i].scores.shape == c.scores.shape \
                else init_calls[i].visible
            dims.add(c.dim)
        if c.weights is None and not c.complete:
            continue
        w = c.seen_weights().double()
        live = torch.ones(w.shape[:-1], dtype=torch.bool, device=w.device)
        if vis is not None:
            v = vis.expand_as(w)
            live = v.any(-1)
            if (~v).any() and live.any():   # a row that sees no key is fully_masked_rows' case, not a leak
                leaked = w.masked_fill(v, 0).nan_to_num(1.0).abs().amax(-1)   # a NaN weight counts as 1: the worst
                masked_w = max(masked_w, float(leaked[live].max()))
        if c.sigmoid:   # each weight in (0, 1) on its own: no row sums to one, no output is a mix of the values
            continue
        s = w.sum(-1)
        row_err = _worst(row_err, float((s - 1).abs()[live].nan_to_num(math.inf).max()) if live.any() else 0.0)  # NaN: inf
        if c.out is not None and c.v is not None:   # no mask known: the hull of every value (wider)
            hull = _worst(hull, _hull(c.out.double(), c.v.double(), torch.ones_like(live[..., None]) if vis is None else vis, live))
    return masked_w, row_err, hull, dims


def _worst(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _hull(out, v, vis, live):
    """The largest excursion of an output outside the range of the values it may mix, relative to
    that range. out (B, h, T_q, d), v (B, h, T_k, d), vis broadcastable to (B, h, T_q, T_k)."""
    vis = vis.expand(out.shape[:-1] + (v.shape[-2],))
    big = torch.finfo(torch.float64).max
    vv = v.unsqueeze(-3)                                      # (B, h, 1, T_k, d)
    lo = vv.masked_fill(~vis.unsqueeze(-1), big).amin(-2)     # (B, h, T_q, d)
    hi = vv.masked_fill(~vis.unsqueeze(-1), -big).amax(-2)
    span = (v.amax(-2, keepdim=True) - v.amin(-2, keepdim=True)).amax(-1, keepdim=True).clamp_min(1e-30)
    exc = (torch.relu(lo - out) + torch.relu(out - hi)) / span
    exc = exc.amax(-1)[live.expand(exc.shape[:-1])]
    return float(exc.nan_to_num(math.inf).max()) if exc.numel() else 0.0   # a NaN output: inf, the worst


def amplified_logits(ctx):
    ctx.require_repeatable()
    exact = ctx.limit(EXACT_REL)   # the target's own rounding noise, where it keeps some
    amp = amplifier(ctx)
    if isinstance(amp, Signal):
        raise type(amp)(amp.why, amp.cause)
    x = ctx.sample(k=30)
    _, init_calls = ctx.probe(x)
    y, calls = amp.probe(ctx, x)
    finite = bool(torch.isfinite(y).all())
    leak = None
    if ctx.require_causal() and finite:   # outputs that are not finite fail already
        t = ctx.T // 2
        x2 = x.clone()
        x2[:, t:] = ctx.sample(k=31)[:, t:]
        y2, _ = amp.probe(ctx, x2)
        leak = rel(y2[:, :t], y[:, :t], "the amplified outputs before t")
    masked_w, row_err, hull, dims = _weights_checks(calls, init_calls)
    _, _, hull0, _ = _weights_checks(init_calls, init_calls)
    hull = _worst(hull, hull0)
    wrong_dim = sorted(d for d in dims if d != -1)
    parts = [("outputs finite", finite, None),
             ("masked keys' largest weight", masked_w <= EXACT_REL, masked_w),
             ("earlier outputs' change with later tokens replaced", leak is None or leak <= exact, leak),
             ("rows' weights sum to 1 (worst |sum - 1|)", (row_err is None or row_err <= ROW_SUM_TOL) and not wrong_dim,
              row_err),
             ("outputs outside their values' hull (at init or amplified)", hull is None or hull <= HULL_REL, hull)]
    held = dict(zip(("nonfinite", "masked_key_weight", "future_leak", "row_sum", "outside_hull"), (p[1] for p in parts)))
    bad = [p for p in parts if not p[1]]
    # the cause named is the first that broke in the formula's order: weights that do not sum to 1 over
    # the keys (a softmax over the queries) make the leak, not the other way round
    cause = next((c for c in ("nonfinite", "masked_key_weight", "row_sum", "future_leak", "outside_hull")
                  if not held[c]), "")
    detail = (f"largest score {amp.reached:.3g} (q and k scaled by {amp.factor:.3g} {amp.where()}); " +
              "; ".join(f"{n}: " + ("n/a" if v is None and i >= 2 else ('yes' if ok else 'no') if v is None else f"{v:.3g}")
                        for i, (n, ok, v) in enumerate(parts))
              + ("; sigmoid weights (each key's on its own): no row sum, no hull" if row_err is None and any(
                  c.sigmoid for c in calls) else "")
              + (f"; softmax taken over dim {wrong_dim}, not the keys" if wrong_dim else ""))
    measured = max([v for _, _, v in parts if v is not None] + ([math.inf] if not finite else []))
    return judged(bool(bad), measured, f"finite; leak <= {exact:g}; hull <= {HULL_REL:g}", detail, cause,
                  largest_score=amp.reached, factor=amp.factor, capped=amp.capped, finite=finite, masked_key_weight=masked_w, leak=leak,
                  row_sum_error=row_err, outside_hull=hull, softmax_dims=wrong_dim)
