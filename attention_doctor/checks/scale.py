"""Score scale: with q and k made unit-variance at their sites, the scores' standard deviation."""
import math
from contextlib import contextmanager

import torch

from attention_doctor.checks.common import SCALE_BAND, judged, na, unseen, visible_scores
from attention_doctor.layouts import measured_sites, scaled_sites
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


def score_scale(ctx):
    sites = ctx.sites()
    if not sites:
        raise NotPerformed("needs the q and k projections (no known q/k layout)", "no_qk_layout")
    f = unit_factors(ctx)
    if f is None:
        raise NotPerformed("a q/k site was not called in the forward", "no_qk_layout")
    x = ctx.sample(k=60)
    after = {}
    with scaled_sites(sites, *f), measured_sites(sites, after):
        _, calls = ctx.probe(x)
    stds, other = [], 0
    for c in calls:
        if c.source == "project" and c.scale is None:   # additive or bilinear scores: not q . k
            other += 1
            continue
        s = visible_scores(c)
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
        raise unseen("needs dot-product scores of a known q/k site's calls (none seen)")
    worst = max(stds, key=lambda v: abs(math.log(max(v, 1e-30))))
    lo, hi = SCALE_BAND
    ok = lo <= worst <= hi
    hint = "" if ok else (" (too large: a missing 1/sqrt(d_k)?)" if worst > hi else
                          " (too small: scores that cannot sharpen, e.g. cosine without a temperature)")
    return judged(not ok, worst, f"in [{lo:g}, {hi:g}]",
                  "score std per attention call with unit-variance q and k: " + ", ".join(f"{v:.3g}" for v in stds) + hint,
                  "too_large" if worst > hi else "too_small", stds=stds, band=[lo, hi])
