"""Score scale: with q and k made unit-variance at their sites, the scores' standard deviation."""
import math
from contextlib import contextmanager

import torch

from attention_doctor.checks.common import SCALE_BAND, judged, na, visible_scores
from attention_doctor.layouts import measured_sites, scaled_sites
from attention_doctor.probes import MASKED
from attention_doctor.signals import NotPerformed


def unit_factors(ctx):
    """{site: factor} for q and for k that make each site's q and k unit-variance (rms 1) on a
    sample input, or None where the target has no known q/k site. Computed once per target."""
    if "unit_qk" not in ctx.cache:
        sites = ctx.sites()
        rms = {}
        if sites:
            with measured_sites(sites, rms):
                ctx.run(ctx.sample(k=60))
        if not sites or not all(rms.get(s.name) for s in sites):
            ctx.cache["unit_qk"] = None
        else:
            ctx.cache["unit_qk"] = ({s.name: 1 / max(rms[s.name][0][0], 1e-30) for s in sites},
                                    {s.name: 1 / max(rms[s.name][0][1], 1e-30) for s in sites})
    return ctx.cache["unit_qk"]


@contextmanager
def unit_qk(ctx, adapter=None):
    """q and k made unit-variance at every site of `adapter` (ctx's target or a converted copy);
    a no-op for a target without known sites."""
    f = unit_factors(ctx)
    if f is None:
        yield False
        return
    sites = ctx.sites(None if adapter is None or adapter is ctx.adapter else adapter)
    with scaled_sites(sites, *f):
        yield True


def _plain(c) -> bool:
    """The call's visible scores are q k^T x its scale and nothing else: sdpa's without a float
    mask that varies along a row, a softmax's equal to q k^T times the scale read off them, a
    hand-made one's (read as q k^T x the fitted scale)."""
    if c.source == "handmade" or c.source == "project":
        return True
    if c.source == "sdpa":
        if c.bias is None:
            return True
        b = c.bias.double().expand(c.raw().shape)
        vis = b > MASKED
        lo = b.masked_fill(~vis, math.inf).amin(-1)
        hi = b.masked_fill(~vis, -math.inf).amax(-1)
        return bool(((hi - lo)[vis.any(-1)] <= 1e-6 * (1 + hi.abs()[vis.any(-1)])).all())   # a 0/-inf mask
    if c.q is None or c.k is None or c.scale is None or c.scores is None:
        return False
    s, raw = c.scores.double(), c.raw()
    vis = c.visible.expand_as(s) if c.visible is not None else torch.ones_like(s, dtype=torch.bool)
    d, r = (s - raw)[vis], raw[vis]
    if not d.numel():
        return True
    return bool(torch.isfinite(d).all()) and float(d.abs().max()) <= 1e-3 * max(float(r.abs().max()), 1e-30)


def _q_parts(ctx, sites, f, x, calls) -> dict:
    """{index in calls: the part of its visible scores linear in q} for the first call of each
    site's module whose scores are not plain q k^T x scale (_plain): what is added to q k^T (a
    relative position bias, ALiBi) does not move with q, q . k x scale does. Measured with that
    site's q times 2 and times 3 (the calls before it unchanged): scores s(f) = f^2 A + f B + C
    give B = 4 (s(2) - s(1)) - 1.5 (s(3) - s(1)) and A = (s(3) - s(1)) / 2 - (s(2) - s(1)); an A
    constant along each row (-|q|^2 of -|q - k|^2) is one a softmax ignores. A call whose scores
    do not move with q (q normalised after the site), move exactly as q does (nothing added), or
    move otherwise (a tanh soft-cap) keeps its scores, read as they are."""
    if ctx.description is not None and ctx.description.repeatable is False:
        return {}   # two forwards differ anyway (sampled weights): no difference is q's alone
    first = {}
    for i, c in enumerate(calls):
        first.setdefault(c.module, i)
    todo = [s for s in sites if s.name in first and not _plain(calls[first[s.name]])]
    out = {}
    for site in todo:
        i = first[site.name]
        moved = []
        for fq in (2.0, 3.0):
            with scaled_sites(sites, *f), site.scaled(fq, 1.0):
                _, again = ctx.probe(x)
            mine = [c for c in again if c.module == site.name]
            moved.append(_rows(mine[0]) if mine and mine[0].source == calls[i].source else None)
        base = _rows(calls[i])
        if base is None or any(m is None or m[0].shape != base[0].shape for m in moved):
            continue
        (s, vis), (s2, _), (s3, _) = base, *moved
        d2, d3 = s2 - s, s3 - s
        size = max(float(s[vis].norm()), 1e-30)
        if float((d2 - s)[vis].norm()) <= 1e-2 * size:
            continue
        if float(d2[vis].norm()) <= 1e-2 * size:   # q, k normalised after the site: q . k scaled inside the call
            inside = _product_part(ctx, sites, f, x, calls, i)
            if inside is not None:
                out[i] = inside
            continue
        lin, quad = 4 * d2 - 1.5 * d3, d3 / 2 - d2
        if float(_centred(quad, vis).norm()) <= 1e-2 * float(_centred(lin, vis).norm()):
            out[i] = lin[vis]
    return out


def _product_part(ctx, sites, f, x, calls, i):
    """The visible part of call i's scores that is its own q . k x scale, where q and k are normalised
    after their site (cosine scores, a q/k norm): q and k times f as the call takes them (its matmul,
    or the fused call's q and k) give s(f) = f^2 A + f B + C (C: a bias, ALiBi's; B: a term linear
    in q or k); A = (s(3) - s(1)) / 2 - (s(2) - s(1)). None where the call cannot be scaled inside,
    its scores do not move, or A is not constant in f (a soft-cap)."""
    c = calls[i]
    mine = frozenset(o.extra["qk_matmul"] for o in calls if o.module == c.module and "qk_matmul" in o.extra)
    if not c.fused and not mine:
        return None
    runs = []
    for fq in (2.0, 3.0, 4.0):
        with scaled_sites(sites, *f):
            _, again = ctx.probe(x, qk_factor=fq, qk_where={c.module}, qk_matmuls=mine)
        runs.append(_rows(again[i]) if len(again) == len(calls) and again[i].source == c.source else None)
    base = _rows(c)
    if base is None or any(r is None or r[0].shape != base[0].shape for r in runs):
        return None
    (s, vis), (s2, _), (s3, _), (s4, _) = base, *runs
    a = (s3 - s) / 2 - (s2 - s)
    a4 = ((s4 - s2) - 2 * (s3 - s2)) / 2   # A again from f = 2, 3, 4: equal where s(f) is that quadratic
    size = float(_centred(a, vis).norm())
    if size <= 1e-9 * max(float(s[vis].norm()), 1e-30) or float(_centred(a4 - a, vis).norm()) > 1e-3 * size:
        return None
    return a[vis]


def _rows(c):
    """(the call's scores as visible_scores reads them, float64, in their shape; visible), or
    None where they are not all finite where visible."""
    if c.q is not None and c.k is not None and (c.source == "handmade" or (c.scale is not None and c.source != "softmax")):
        s = c.raw() + (c.bias.double() if c.bias is not None else 0.0)
    elif c.scores is not None:
        s = c.scores.double()
    else:
        return None
    vis = torch.ones_like(s, dtype=torch.bool) if c.visible is None else c.visible.expand_as(s)
    return (s, vis) if bool(torch.isfinite(s[vis]).all()) else None


def _centred(d, vis) -> torch.Tensor:
    """d's visible entries less each row's mean over them (a constant per row: a softmax ignores it)."""
    n = vis.sum(-1, keepdim=True).clamp_min(1)
    mean = d.masked_fill(~vis, 0.0).sum(-1, keepdim=True) / n
    return (d - mean)[vis]


NORMED = 0.05   # q times 2 at a site moves q k^T by at most this (relative): normalised after it (a proportional q doubles it)


def _normalised_after(ctx, x, base) -> bool:
    """Every rejected registry site's q times 2 leaves its calls' q k^T within NORMED of what it
    was: q and k are normalised after the sites (up to the norm's eps), not mapped otherwise."""
    rejected = set(ctx.info.get("qk_sites_rejected", ()))
    sites = [s for _, _, s in ctx.modules if s is not None and s.name in rejected]
    if not sites:
        return False
    for site in sites:
        mine = [c for c in base if c.module == site.name and c.q is not None and c.k is not None]
        with site.scaled(2.0, 1.0):
            _, calls = ctx.probe(x)
        twice = [c for c in calls if c.module == site.name and c.q is not None and c.k is not None]
        if not mine or len(twice) != len(mine):
            return False
        for a, b in zip(mine, twice):
            qa = a.q.double() @ a.k.double().transpose(-2, -1)
            qb = b.q.double() @ b.k.double().transpose(-2, -1)
            change = float((qb - qa).abs().max()) / max(float(qa.abs().max()), 1e-30)
            if not change <= NORMED:
                return False
    return True


def _in_calls(ctx, products=False):
    """[score std per call at unit-variance q and k], measured on q and k as the attention calls get
    them (after whatever normalises them: Llama 4's weightless RMS norm, whose eps leaves q k^T
    neither scaled nor kept when its input is scaled; or maps them, where the calls' scores are their
    q k^T x scale; with `products`, also the product a sum of scores adds: XLNet's content term), or
    None where no call takes q and k that the probe can scale. q and k times f inside one module's
    calls (the calls before them unchanged) give its first call's scores f^2 A + f B + C (A: q . k x
    scale; B: a term linear in q or k; C: a bias, the other terms of a sum); A = (s(3) - s(1)) / 2 -
    (s(2) - s(1)), over rms q x rms k. A call whose A is 0 (scaling the product did not move its
    scores: it does not feed them) is not measured."""
    x = ctx.sample(k=60)
    _, base = ctx.probe(x, keep_graph=True)
    seen = [c for c in base if c.q is not None and c.k is not None]
    # calls whose scores are their own q k^T x scale and nothing else (a kernel's contract): what they
    # dot is what the scale applies to, whatever mapped q and k after their projections (polar
    # embeddings' softplus, an l2 distance's augmented q and k); otherwise only q and k normalised after
    plain = all(_plain(c) or (products and "qk_matmul" in c.extra) for c in seen)
    if not seen or not (plain or _normalised_after(ctx, x, base)):
        return None
    every = frozenset(c.extra["qk_matmul"] for c in base if "qk_matmul" in c.extra)
    inside = frozenset(c.module for c in base if c.fused) | {n for n, _ in every}
    stds = []
    for m in sorted(inside):
        i = next(j for j, c in enumerate(base) if c.module == m)
        c = base[i]
        mine = frozenset(mm for mm in every if mm[0] == m)
        moved = [ctx.probe(x, qk_factor=f, qk_where={m}, qk_matmuls=mine)[1] for f in (2.0, 3.0)]
        if c.q is None or c.k is None or any(len(t) != len(base) or t[i].source != c.source for t in moved):
            continue
        s, s2, s3 = (visible_scores(t) for t in (c, moved[0][i], moved[1][i]))
        if not s.shape == s2.shape == s3.shape or s.numel() < 2:
            continue
        a = (s3 - s) / 2 - (s2 - s)
        if bool(torch.isfinite(a).all()) and float(a.abs().max()) <= 1e-9 * max(float(s.abs().max()), 1e-30):
            continue
        # q and k as they were before a constant the forward multiplied them by last (q * scale before
        # q k^T: that factor is the scale, and unit variance is q's without it)
        graph = c.extra.get("graph", (None, None))
        rq, rk = (float(t.double().pow(2).mean().sqrt()) / abs(_factor_before(g)) for t, g in zip((c.q, c.k), graph))
        stds.append(float(a.std()) / max(rq * rk, 1e-30) if bool(torch.isfinite(a).all()) else math.inf)
    return stds or None


MOVES_ONLY = ("View", "UnsafeView", "Permute", "Transpose", "Expand", "Unsqueeze", "Squeeze", "Clone", "Alias",
              "Select", "Slice", "Unbind", "Split", "Reshape")   # autograd nodes that move entries, nothing else


def _factor_before(t) -> float:
    """The constant t was last multiplied (or divided) by, read off its autograd graph through the
    nodes that only move entries (views, permutes, expands; the probe's own rearranging); 1 where
    the last arithmetic is anything else, or t keeps no graph. Mega, like many eager codes, scales q
    before q k^T: in the call, q carries the scale."""
    node = getattr(t, "grad_fn", None)
    while node is not None and type(node).__name__.removesuffix("Backward0").removesuffix("Backward1") in MOVES_ONLY:
        ins = [fn for fn, _ in node.next_functions if fn is not None]
        node = ins[0] if len(ins) == 1 else None
    name = type(node).__name__ if node is not None else ""
    one = lambda v: isinstance(v, torch.Tensor) and v.numel() == 1   # noqa: E731
    other, mine = getattr(node, "_saved_other", None), getattr(node, "_saved_self", None)
    if name.startswith("MulBackward") and one(other) and not one(mine):
        return float(other) or 1.0
    if name.startswith("MulBackward") and one(mine) and not one(other):
        return float(mine) or 1.0
    if name.startswith("DivBackward") and one(other) and not one(mine):
        return 1.0 / float(other) if float(other) else 1.0
    return 1.0


def score_scale(ctx):
    sites = ctx.sites()
    if not sites and ctx.info.get("qk_sites_rejected"):   # q, k not a multiple of any module's output there
        stds = _in_calls(ctx)
        if stds is None:
            raise NotPerformed("needs q and k in proportion to the output of a module (scaling each candidate did "
                               "not scale q k^T: a non-linear map after the projections, polar embeddings' "
                               "softplus)", "no_qk_layout")
        return _judged(stds, " (q and k as the attention calls get them: scaling the q/k sites did not scale q "
                             "k^T, normalised or mapped after them)")
    if not sites:
        # scores that are all 0 (ZAYA's key temperature at init) verify no q/k site: the target's, not a layout's
        _, calls = ctx.probe(ctx.sample(k=60))
        scores = [visible_scores(c) for c in calls if c.scores is not None or c.q is not None]
        if scores and all(s.numel() and float(s.abs().max()) == 0.0 for s in scores):
            raise NotPerformed("every visible score is 0 at init (a scale initialised to zero): the scores' spread "
                               "says nothing of their scale", "scores_zero")
        stds = _in_calls(ctx, products=True)
        if stds is not None:   # no module's output is q or k (XLNet's einsums with Parameters): the calls' own
            return _judged(stds, " (q and k as the attention calls get them: no module's output is a multiple of "
                                 "q or k; the product that feeds each call's scores scaled inside it)")
        raise ctx.unseen("needs the q and k projections (no known q/k layout)", "no_qk_layout")
    f = unit_factors(ctx)
    if f is None:
        raise NotPerformed("a q/k site was not called in the forward", "no_qk_layout")
    x = ctx.sample(k=60)
    after = {}
    with scaled_sites(sites, *f), measured_sites(sites, after):
        _, calls = ctx.probe(x)
    q_part = _q_parts(ctx, sites, f, x, calls)
    stds, other = [], 0
    for i, c in enumerate(calls):
        if c.source == "project" and c.scale is None:   # additive or bilinear scores: not q . k
            other += 1
            continue
        s = q_part.get(i, visible_scores(c))
        if s.numel() < 2 or c.module not in after or not after[c.module]:
            continue
        rq, rk = after[c.module][0]
        # a visible score that is not finite at unit-variance q and k: no std is small enough (never read as 0)
        std = float(s.std()) / max(rq * rk, 1e-30) if bool(torch.isfinite(s).all()) else math.inf
        stds.append(std)
    if not stds and other:   # every call's scores are something else than a scaled q . k
        return na("scores are not a fixed multiple of q . k (additive or bilinear scores, a learned scale): no "
                  "1/sqrt(d_k) to miss", "not_dot_product")
    if not stds:
        raise ctx.unseen("needs dot-product scores of a known q/k site's calls (none seen)")
    return _judged(stds)


def _judged(stds, where=""):
    worst = max(stds, key=lambda v: abs(math.log(max(v, 1e-30))))
    lo, hi = SCALE_BAND
    ok = lo <= worst <= hi
    hint = "" if ok else (" (too large: a missing 1/sqrt(d_k)?)" if worst > hi else
                          " (too small: scores that cannot sharpen, e.g. cosine without a temperature)")
    return judged(not ok, worst, f"in [{lo:g}, {hi:g}]",
                  "score std per attention call with unit-variance q and k" + where + ": "
                  + ", ".join(f"{v:.3g}" for v in stds) + hint,
                  "too_large" if worst > hi else "too_small", stds=stds, band=[lo, hi])
