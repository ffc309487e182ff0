"""Path agreement: where the target switches between attention paths, the paths agree with each
other and each path's attention calls agree with the textbook attention on their own q, k, v."""
import math

import torch

from attention_doctor.checks.common import AGREE_REL, held_in_part, judged, na, rel, row
from attention_doctor.result import FAIL, NA
from attention_doctor.signals import TargetRaised, Unreachable, Unsupported


def _reference_error(calls) -> float | None:
    errs = []
    for c in calls:
        if not c.complete:
            continue
        ref = c.reference(torch.float64)
        live = torch.ones(ref.shape[:-1], dtype=torch.bool, device=ref.device)
        if c.visible is not None:
            live = c.visible.expand(ref.shape[:-1] + (c.k.shape[-2],)).any(-1)
        errs.append(rel(c.out[live], ref[live], "the textbook attention on the call's q, k, v"))
    return max(errs) if errs else None


def _agree(a: torch.Tensor, b: torch.Tensor, what: str) -> float:
    """Two paths' outputs, neither the reference: one not finite where the other is disagrees
    (inf); both not finite at the same places leaves nothing to compare (NotPerformed)."""
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    if fa.shape == fb.shape and not torch.equal(fa, fb):
        return math.inf
    return rel(a, b, what)


def path_agreement(ctx):
    a = ctx.adapter
    paths = ctx.call(a.paths)
    if len(paths) < 2:
        return na("no switch between attention paths (an Adapter's paths() and use_path() enable it)", "no_paths")
    x = ctx.sample(k=70)
    xp, m = ctx.left_padded(k=71)
    outs, padded_why, raised, textbook, worst, compared = {}, {}, set(), [], 0.0, 0
    for p in paths:   # a path the target refuses to switch to (Unreachable) ends the check: inconclusive
        with ctx.use_path(p):
            try:
                y, calls = ctx.probe(x)
            except TargetRaised as e:   # a path the target switches to raises on a valid input
                return row(FAIL, None, "", f"path {p} raised {e.error}", "target_raised", limit=AGREE_REL,
                           error=e.error, paths=textbook)
            try:
                yp = ctx.run(xp, m)[m]
            except Unreachable as e:
                yp, padded_why[p] = None, e.why
            except Unsupported:   # no padding mask by nature: the plain batch alone
                yp = None
            except TargetRaised as e:   # padding's failure; between the paths, compared below
                yp, padded_why[p] = None, f"the target raised: {e.error}"
                raised.add(p)
        outs[p] = (y, yp)
        e = _reference_error(calls)
        compared += e is not None
        textbook.append({"path": p, "textbook": e})
        worst = max(worst, e or 0.0)
    first = paths[0]
    parts = [f"{t['path']}: calls against the textbook attention "
             f"{'n/a' if t['textbook'] is None else format(t['textbook'], '.3g')}" for t in textbook]
    cause = "call_vs_textbook" if worst > AGREE_REL else ""
    against = []
    for p in paths[1:]:
        d = _agree(outs[p][0], outs[first][0], f"both paths' outputs ({first}, {p})")
        dp = None
        if outs[p][1] is not None and outs[first][1] is not None:
            dp = _agree(outs[p][1], outs[first][1], f"both paths' padded outputs ({first}, {p})")
        against.append({"path": p, "plain": d, "padded": dp})
        where = [b for b, v in (("plain", d), ("padded", dp)) if v == math.inf]
        d = max(d, dp or 0.0)
        parts.append(f"{p} against {first}: {d:.3g}" + (f" (the {' and '.join(where)} batch's outputs are not finite "
                                                          "on one path only)" if where else ""))
        cause = cause or ("paths_differ" if d > AGREE_REL else "")
        worst = max(worst, d)
    # the padded batch raises on some paths and runs on others: the paths differ
    split = bool(raised) and any(outs[p][1] is not None for p in paths)
    if padded_why:
        parts.append("the padded batch: " + "; ".join(f"{p}: {w}" for p, w in padded_why.items()))
    cause = cause or ("paths_differ" if split else "")
    detail = "; ".join(parts) + " (padded batch: real tokens only)"
    bad = worst > AGREE_REL or split
    na_parts = {}
    if not bad and not compared:   # the paths agree; against the textbook, nothing was seen
        unseen = ctx.unseen("the paths agree, but no attention call of theirs was seen to compare against the textbook")
        if unseen.outcome is not NA:
            raise unseen
        na_parts = {"not_applicable": ["textbook"]}   # no attention weights at all: the paths' agreement is the check
        detail += f"; against the textbook: n/a, {unseen.why}"
    r = judged(bad, worst, f"<= {AGREE_REL:g}", detail, cause, limit=AGREE_REL, paths=textbook, against_first=against,
               **na_parts)
    return held_in_part(r, {"the padded batch": "; ".join(f"{p}: {w}" for p, w in padded_why.items())}
                        if padded_why else {})
