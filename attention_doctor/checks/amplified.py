"""Amplified logits: q and k scaled until the largest score reaches 1e4..1e5."""
import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from attention_doctor.checks.common import (
    AMP_HI,
    AMP_LO,
    AMP_TARGET,
    EXACT_REL,
    HULL_REL,
    ROW_SUM_TOL,
    finite_max_abs,
    inconclusive,
    judged,
    rel,
    visible_scores,
)
from attention_doctor.layouts import scaled_sites
from attention_doctor.probes import MASKED
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


REACH = 1e6   # a finite mask fill is sought within scores this large: ten times the amplification's top


def fill_within_reach(calls, init, largest: float) -> tuple[float, float] | None:
    """(the largest score that takes a row's visible scores all below its call's finite mask fill, twice
    over; the fill) where a call's masked scores at init all hold one finite value (masked_fill(-1e4), read
    from the traced scores) and a row whose visible scores in `calls` (whose largest score is `largest`)
    are all negative gets there with q and k scaled alike, no further than REACH; else None. There the
    masked keys take the row's weight: amplified that far, the outputs show it (the leak)."""
    best = None
    for c, c0 in zip(calls, init):
        if c.sigmoid or c.scores is None or c0.scores is None or c0.scores.shape != c.scores.shape:
            continue
        s0, s = c0.scores.double(), c.scores.double()
        vis = s0 > MASKED   # as the probe reads a mask at init (flex's score_mod may fill finitely)
        masked = s0[~vis]
        if not masked.numel():
            continue
        fill = float(masked[0])
        if not (math.isfinite(fill) and -FILLS < fill < 0.0) or not bool((masked == fill).all()):
            continue
        top = s.masked_fill(~vis, -math.inf).amax(-1)   # each row's largest visible score
        rows = vis.any(-1) & (top < 0) & torch.isfinite(top)
        if rows.any():
            need = 2.0 * float((fill / top[rows]).min()) * largest
            best = (need, fill) if best is None or need < best[0] else best
    return best if best is not None and best[0] <= REACH else None


WITNESS = 2.0      # a reading's effect on the call's own output: more than twice what the reading leaves unexplained
SINK_SPREAD = 1e-2   # logits: the sink a row's missing weight implies is one logit per head, whatever the query
SINK_ROWS = 4        # rows of a head that must imply it (a sink is read at init, where rows miss a share of their weight)


@dataclass
class Readings:
    """What amplified_logits read inside the forward: the largest weight on a masked key, the worst
    |row sum - 1|, the worst hull excursion, the softmax dims, and per kind ("masked", "row",
    "hull") whether each call past its limit has its own output agree (True), disagree (False) or
    not seen (None); `sinks`: the calls whose rows sum below one by a sink's design."""
    masked_w: float = 0.0
    masked_later: float = 0.0   # the largest weight on a masked key after its query (the outputs can show it)
    row_err: float | None = None
    hull: float | None = None
    dims: set = field(default_factory=set)
    witnessed: dict = field(default_factory=lambda: {"masked": [], "row": [], "hull": []})
    sinks: set = field(default_factory=set)


def _sink(c, w, vis, live) -> bool:
    """The call's rows sum below one as a softmax with one more key of its own logit per head
    would make them (attention sinks added to the denominator: exp(s) / (exp(sink) + sum exp(s))):
    weights >= 0, no row above one, and the logit each row's missing weight implies,
    log(d / (1 - d)) + logsumexp(its visible q k^T x scale), one per head over batch and queries.
    A weight lost otherwise (a mask applied after the softmax) implies one per query."""
    if c.q is None or c.k is None or not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        return False
    d = 1 - w.sum(-1)
    if bool((d < -ROW_SUM_TOL)[live].any()) or not bool((d > ROW_SUM_TOL)[live].any()):
        return False
    raw = c.raw()
    if raw.shape != w.shape:
        return False
    if vis is not None:
        raw = raw.masked_fill(~vis.expand_as(raw), float("-inf"))
    use = live & (d > 1e-4) & (d < 1 - 1e-4)
    sigma = (d / (1 - d)).clamp_min(1e-300).log() + torch.logsumexp(raw, -1)   # (B, h, T_q)
    sigma = sigma.masked_fill(~use, float("nan")).transpose(0, -2).flatten(-2)   # heads first: (h, B T_q)
    lo, hi = sigma.nan_to_num(float("inf")).amin(-1), sigma.nan_to_num(float("-inf")).amax(-1)
    seen = use.transpose(0, -2).flatten(-2).sum(-1) >= SINK_ROWS
    return bool(seen.any()) and bool(((hi - lo) <= SINK_SPREAD)[seen].all())


def _own_output(c, w, vis):
    """What the call's own output says of its weights, relative to its values' range: the largest
    |out - w v| (what the reading leaves unexplained), |out - (w on the visible keys) v| and
    |out - (w / its row sums) v|; None where out or v is not seen or the products are not finite."""
    if c.out is None or c.v is None:
        return None
    out, v = c.out.double(), c.v.double()
    try:
        wv = w @ v
        vis_w = w if vis is None else w.masked_fill(~vis.expand_as(w), 0.0)
        alts = (wv, vis_w @ v, (w / w.sum(-1, keepdim=True)) @ v)
    except RuntimeError:   # weights and values of shapes that do not multiply: not this call's v
        return None
    if any(t.shape != out.shape or not bool(torch.isfinite(t).all()) for t in alts) or not bool(torch.isfinite(out).all()):
        return None
    span = float((v.amax(-2) - v.amin(-2)).max().clamp_min(1e-30))
    return tuple(float((out - t).abs().max()) / span for t in alts)


def _agrees(errors, which: int) -> bool | None:
    """The call's output shows the reading `which` (1: the masked keys' weight, 2: the row sums):
    the output is farther from the reading without it than twice from the reading itself."""
    if errors is None:
        return None
    return errors[which] > max(WITNESS * errors[0], HULL_REL)


def _weights_checks(calls, init_calls, sinks=None) -> Readings:
    """The readings of the amplified calls (their masks inferred from the same calls at init);
    `sinks`: the indices of calls whose rows sum below one by a sink's design, found at init
    (None: these are the calls at init, found here)."""
    r = Readings()
    for i, c in enumerate(calls):
        if c.source == "softmax" and c.dim != -1 and c.q is None:
            # a softmax over another dim than the last of a tensor no q k^T fed (a mix of layers, as
            # aggregated residuals take): not attention weights. One over q k^T's queries is judged
            continue
        vis = c.visible
        if c.traced or c.source == "flex":  # masks inferred from the same call before amplification (flex's scores too)
            same = i < len(init_calls) and init_calls[i].source == c.source
            vis = None if not same else amplified_visible(c, init_calls[i]) if c.scores is not None \
                and init_calls[i].scores is not None and init_calls[i].scores.shape == c.scores.shape \
                else init_calls[i].visible
            r.dims.add(c.dim)
        if c.weights is None and not c.complete:
            continue
        w = c.seen_weights().double()
        live = torch.ones(w.shape[:-1], dtype=torch.bool, device=w.device)
        errors = _own_output(c, w, vis)
        if vis is not None:
            v = vis.expand_as(w)
            live = v.any(-1)
            if (~v).any() and live.any():   # a row that sees no key is fully_masked_rows' case, not a leak
                leaked = w.masked_fill(v, 0).nan_to_num(1.0).abs().amax(-1)   # a NaN weight counts as 1: the worst
                m = float(leaked[live].max())
                r.masked_w = max(r.masked_w, m)
                if w.shape[-1] == w.shape[-2] and "layout_unmeasured" not in c.extra:
                    later = torch.ones(w.shape[-2:], dtype=torch.bool, device=w.device).triu(1)
                    on_later = w.masked_fill(v | ~later, 0).nan_to_num(1.0).abs().amax(-1)
                    r.masked_later = max(r.masked_later, float(on_later[live].max()))
                if m > EXACT_REL:
                    r.witnessed["masked"].append(_agrees(errors, 1))
        if c.sigmoid:   # each weight in (0, 1) on its own: no row sums to one, no output is a mix of the values
            continue
        sink = _sink(c, w, vis, live) if sinks is None else i in sinks
        if sink:
            r.sinks.add(i)
        s = w.sum(-1)
        err = (s - 1).clamp_min(0) if sink else (s - 1).abs()   # a sink's rows may sum below one, never above
        e = float(err[live].nan_to_num(math.inf).max()) if live.any() else 0.0   # NaN: inf
        r.row_err = _worst(r.row_err, e)
        if e > ROW_SUM_TOL:
            r.witnessed["row"].append(_agrees(errors, 2))
        if c.out is not None and c.v is not None:   # no mask known: the hull of every value (wider)
            h = _hull(c.out.double(), c.v.double(), torch.ones_like(live[..., None]) if vis is None else vis, live,
                      zero=sink)
            r.hull = _worst(r.hull, h)
            if h > HULL_REL:
                r.witnessed["hull"].append(None if errors is None else h > WITNESS * errors[0])
        elif c.extra.get("combined_weights") and live.any():
            # a map combined with others before its product (differential attention's A1 - lambda A2): its own
            # output is never formed, so its weights bound it: their mass below zero is how far a mix of the
            # values by this map would leave their hull (relative to their span); a normalisation's map has none
            h = float(torch.relu(-w).sum(-1)[live].nan_to_num(math.inf).max())
            r.hull = _worst(r.hull, h)
            if h > HULL_REL:
                r.witnessed["hull"].append(None)   # no output of its own to show it either way
    return r


def _worst(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _hull(out, v, vis, live, zero=False):
    """The largest excursion of an output outside the range of the values it may mix, relative to
    that range. out (B, h, T_q, d), v (B, h, T_k, d), vis broadcastable to (B, h, T_q, T_k). zero:
    a sink's value, 0, is among them (the weight its rows miss mixes nothing)."""
    vis = vis.expand(out.shape[:-1] + (v.shape[-2],))
    big = torch.finfo(torch.float64).max
    vv = v.unsqueeze(-3)                                      # (B, h, 1, T_k, d)
    lo = vv.masked_fill(~vis.unsqueeze(-1), big).amin(-2)     # (B, h, T_q, d)
    hi = vv.masked_fill(~vis.unsqueeze(-1), -big).amax(-2)
    if zero:
        lo, hi = lo.clamp_max(0.0), hi.clamp_min(0.0)
    span = (v.amax(-2, keepdim=True) - v.amin(-2, keepdim=True)).amax(-1, keepdim=True).clamp_min(1e-30)
    exc = (torch.relu(lo - out) + torch.relu(out - hi)) / span
    exc = exc.amax(-1)[live.expand(exc.shape[:-1])]
    return float(exc.nan_to_num(math.inf).max()) if exc.numel() else 0.0   # a NaN output: inf, the worst


def amplified_logits(ctx):
    amp = amplifier(ctx)
    if isinstance(amp, Signal):   # n/a (no attention weights at all) decided before the noise
        raise type(amp)(amp.why, amp.cause)
    ctx.require_repeatable()
    exact = ctx.limit(EXACT_REL)   # the target's own rounding noise, where it keeps some
    x = ctx.sample(k=30)
    _, init_calls = ctx.probe(x)
    fill, past = fill_within_reach(init_calls, init_calls, _max_score(init_calls)), None
    for _ in range(4):   # amplified past a finite fill in reach, measured again each time (scores need not scale alike)
        if fill is None or amp.capped or fill[0] <= amp.reached * 1.01:
            break
        amp, past = amp.scaled_to(fill[0]), fill[1]
        fill = fill_within_reach(amp.probe(ctx, x)[1], init_calls, amp.reached)
    y, calls = amp.probe(ctx, x)
    finite = bool(torch.isfinite(y).all())
    leak = None
    if ctx.require_causal() and finite:   # outputs that are not finite fail already
        t = ctx.T // 2
        x2 = x.clone()
        x2[:, t:] = ctx.sample(k=31)[:, t:]
        y2, _ = amp.probe(ctx, x2)
        leak = rel(y2[:, :t], y[:, :t], "the amplified outputs before t")
    init = _weights_checks(init_calls, init_calls)
    amped = _weights_checks(calls, init_calls, init.sinks)
    masked_w, row_err, hull = amped.masked_w, amped.row_err, _worst(amped.hull, init.hull)
    wrong_dim = sorted(d for d in amped.dims if d != -1)
    parts = [("outputs finite", finite, None),
             ("masked keys' largest weight", masked_w <= EXACT_REL, masked_w),
             ("earlier outputs' change with later tokens replaced", leak is None or leak <= exact, leak),
             ("rows' weights sum to 1 (worst |sum - 1|)", (row_err is None or row_err <= ROW_SUM_TOL) and not wrong_dim,
              row_err),
             ("outputs outside their values' hull (at init or amplified)", hull is None or hull <= HULL_REL, hull)]
    held = dict(zip(("nonfinite", "masked_key_weight", "future_leak", "row_sum", "outside_hull"), (p[1] for p in parts)))
    disagree = _unwitnessed(held, amped, init, leak, exact, wrong_dim)
    for c in disagree:   # read inside the forward, contradicted by what the outputs do: not a fail
        held[c] = True
    bad = [c for c, ok in held.items() if not ok]
    # the cause named is the first that broke in the formula's order: weights that do not sum to 1 over
    # the keys (a softmax over the queries) make the leak, not the other way round
    cause = next((c for c in ("nonfinite", "masked_key_weight", "row_sum", "future_leak", "outside_hull")
                  if not held[c]), "")
    detail = (f"largest score {amp.reached:.3g} (q and k scaled by {amp.factor:.3g} {amp.where()}"
              + ("" if past is None else f"; past the masks' finite fill {past:g}, which a row's scores reach") + "); " +
              "; ".join(f"{n}: " + ("n/a" if v is None and i >= 2 else ('yes' if ok else 'no') if v is None else f"{v:.3g}")
                        for i, (n, ok, v) in enumerate(parts))
              + ("; sigmoid weights (each key's on its own): no row sum, no hull" if row_err is None and any(
                  c.sigmoid for c in calls) else "")
              + (f"; softmax taken over dim {wrong_dim}, not the keys" if wrong_dim else "")
              + (f"; {len(amped.sinks | init.sinks)} call(s) whose rows sum below one by a sink's design (one logit per "
                 "head takes the rest): held to rows <= 1 and a hull with the sink's zero value"
                 if amped.sinks | init.sinks else ""))
    measured = max([v for _, _, v in parts if v is not None] + ([math.inf] if not finite else []))
    meas = dict(largest_score=amp.reached, factor=amp.factor, capped=amp.capped, finite=finite, masked_key_weight=masked_w,
                leak=leak, row_sum_error=row_err, outside_hull=hull, softmax_dims=wrong_dim, unwitnessed=sorted(disagree))
    tol = f"finite; leak <= {exact:g}; hull <= {HULL_REL:g}"
    if disagree and not bad:
        return inconclusive("what was read inside the forward and what the outputs do disagree: " +
                            "; ".join(disagree.values()), "readings_disagree", measured, tol, detail, **meas)
    if disagree:
        detail += "; not judged, the outputs disagree: " + "; ".join(disagree.values())
    return judged(bool(bad), measured, tol, detail, cause, **meas)


def _unwitnessed(held, amped, init, leak, exact, wrong_dim) -> dict:
    """{part: both readings}: the parts read inside the forward (a masked key's weight, row sums, a
    hull) that fail there while what the outputs do contradicts them: the model's outputs do not
    move with the later tokens a masked weight reads, or the call's own output is what its weights
    and values give without the reading (attention_doctor docs: no fail without a witness). A part
    an output measurement shows (the leak, the softmax's dim, the call's output) stands; so does
    one nothing could show either way (the call's output unseen, no later key involved)."""
    out = {}
    leaked = leak is not None and leak > exact
    seen = amped.witnessed["masked"]
    if not held["masked_key_weight"] and not leaked and True not in seen:
        if leak is not None and amped.masked_later > EXACT_REL:
            out["masked_key_weight"] = (f"a masked later key's weight {amped.masked_later:.3g}, while the earlier "
                                        f"outputs move by {leak:.3g} with the later tokens replaced")
        elif False in seen:
            out["masked_key_weight"] = (f"a masked key's weight {amped.masked_w:.3g}, while the call's own output is "
                                        "what its weights give without the masked keys")
    seen = amped.witnessed["row"]
    if not held["row_sum"] and not wrong_dim and not leaked and True not in seen and False in seen:
        out["row_sum"] = (f"rows' weights summing to 1 +- {amped.row_err:.3g}, while the call's own output is what "
                          "those weights give normalised")
    seen = amped.witnessed["hull"] + init.witnessed["hull"]
    if not held["outside_hull"] and True not in seen and False in seen:
        out["outside_hull"] = ("an output outside its values' hull, while that output is not what the call's weights "
                               "give its values (the weights or values read are not the ones it mixed)")
    return out
