"""Low precision (float16, bfloat16) and long positions."""
import math
from contextlib import nullcontext

import torch

from attention_doctor.adapters import Unsupported
from attention_doctor.checks.amplified import _max_score, amplifier, not_amplified
from attention_doctor.checks.cached_positions import bfloat16_half, long_positions_through_cache
from attention_doctor.checks.common import (ABSOLUTE_POS, AMP_MODERATE, LONG_BF16_RATIO, LONG_OFFSET, LONG_REL,
                                            LOW_PRECISION_RATIO, TargetRaised, inconclusive, na, not_repeatable, rel, row,
                                            unsupported)
from attention_doctor.checks.record import Check
from attention_doctor.checks.scale import unit_qk

LOW = (torch.float16, torch.bfloat16)
# low_precision's causes: which pattern broke (docs/doctor.md explains the first with numbers)
CAUSES = {
    "qk_before_scale": "q k^T formed in low precision before the scale: |q.k| passes the dtype's largest value "
                       "(65504 in float16) while the scaled score would not; scale q first, or compute the "
                       "scores in float32",
    "mask_fill_overflow": "a finite mask fill (finfo.min) plus a negative score rounds to -inf in low precision: a "
                          "row with no visible key turns all -inf, its softmax NaN, and the NaN reaches real tokens "
                          "(0 * NaN); fill once, or combine boolean masks before filling",
    "softmax_low_precision": "the softmax overflowed in low precision: finite scores, non-finite weights (exp "
                             "without the row maximum subtracted, or in float16); compute it in float32",
    "fully_masked_row": "a row with no visible key is all -inf and its softmax NaN (fully_masked_rows' failure)",
    "scores_overflow": "the scaled scores themselves pass the dtype's range (the reference overflows as well)",
    "output_overflow": "finite weights, non-finite weights @ v",
    "outside_attention": "the overflow is outside attention's scores (q, k, v arrive non-finite, or every "
                         "attention call is finite)",
    "raised_in_low_precision": "the target raises in this precision on a plain batch",
    "error_ratio": "finite, but an attention call's error against float64 exceeds twice the textbook's in the "
                   "same dtype",
    "unattributed": "non-finite, the calls could not be read to say why",
}


def _name(dt):
    return str(dt).replace("torch.", "")


def _call_errors(ctx, lp, x):
    """Per attention call of the target in low precision: (its error, the reference attention's
    error in the same dtype), both against float64 on the call's own q, k, v."""
    _, calls = ctx.probe(x, adapter=lp)
    out = []
    for c in calls:
        if not c.complete:
            continue
        ref = c.reference(torch.float64)
        live = torch.isfinite(ref).all(-1)   # rows with a visible key (the reference returns 0 otherwise)
        if c.visible is not None:
            live = live & c.visible.expand(ref.shape[:-1] + (c.k.shape[-2],)).any(-1)
        e_t = rel(c.out[live], ref[live])
        e_r = rel(c.reference(c.q.dtype)[live], ref[live])
        out.append((e_t, e_r))
    return out


def _levels(amp):
    """(label, amplifier or None) in rising order: at init, scores ~1e3 (finfo(float16).min + a score
    below -16 overflows to -inf), ~3e4 (an unscaled q k^T passes 65504 in float16)."""
    if not isinstance(amp, str) and amp.capped:   # the most the target's scores reach
        return [("", None), (f" at its capped scores ~{amp.reached:.3g}", amp)]
    return [("", None)] + ([] if isinstance(amp, str) else
                           [(" at scores ~1e3", amp.scaled_to(AMP_MODERATE)), (" at scores ~3e4", amp)])


def _run(ctx, a, lp, autocast_dt, xx, m, calls=False):
    """lp's output on (xx, m) with scores amplified by `a` (None: as they are), under autocast in
    autocast_dt if given; with calls=True, (output, the attention calls seen)."""
    cast = torch.autocast(lp.device.type, dtype=autocast_dt) if autocast_dt else nullcontext()
    with cast:
        if a is not None:
            y, seen = a.probe(ctx, xx, m, adapter=lp)
        elif calls:
            y, seen = ctx.probe(xx, m, adapter=lp)
        else:
            y, seen = ctx.run(xx, m, adapter=lp), None
    return (y, seen) if calls else y


def _nonfinite(ctx, amp, lp, autocast_dt, x, padded):
    """Non-finite real outputs of `lp` on a plain and a left-padded batch at each of _levels(amp),
    lowest first. Returns (what was found, the first failing run: (label, amplifier, batch) or
    None); a plain batch that raises is found too ("raised")."""
    found, first = [], None
    for lvl, a in _levels(amp):
        for label, (xx, m) in (("plain", (x, None)), ("left-padded", padded)):
            try:
                y = _run(ctx, a, lp, autocast_dt, xx, m)
            except Unsupported:
                continue
            except TargetRaised as e:
                if m is None:   # a plain batch the target cannot run in this precision
                    found.append(f"{label}{lvl} raised {e}")
                    first = first or ("raised", a, (xx, m))
                continue        # a mask the target rejects is padding's failure
            n = int((~torch.isfinite(y if m is None else y[m])).sum())
            if n:
                found.append(f"{n} non-finite {label}{lvl}")
                first = first or (lvl, a, (xx, m))
    return found, first


def _qk(c) -> float:
    """max |q.k| of a call's own q and k (float64: the value before any dtype could round it)."""
    return float((c.q.double() @ c.k.double().transpose(-2, -1)).abs().max())


def _cause(calls, calls32, dt) -> tuple[str, str]:
    """Which pattern made the first non-finite value of a low-precision run, from its attention
    calls against the same run in the target's own precision (calls32): (cause, what shows it)."""
    big = torch.finfo(dt).max
    inf = float("inf")
    for i, c in enumerate(calls):
        c32 = calls32[i] if calls32 is not None and len(calls32) == len(calls) else None
        where = f"call {i} ({c.module or c.source})"
        if any(t is not None and not torch.isfinite(t).all() for t in (c.q, c.k, c.v)):
            return "outside_attention", f"{where} got non-finite q, k or v: the overflow happened before attention"
        s = c.scores
        if s is not None and (torch.isnan(s).any() or (s == inf).any()):
            scale = c32.scale if c32 is not None and c32.scale else c.scale
            if c.q is not None and c.k is not None and scale:
                raw = _qk(c)
                if raw > big >= raw * abs(scale):
                    return "qk_before_scale", (f"{where}: max |q.k| {raw:.3g} passes {_name(dt)}'s {big:.5g} before "
                                               f"the scale {scale:.3g} (scaled: {raw * abs(scale):.3g}, in range)")
            return "scores_overflow", f"{where}: the scores the softmax got hold inf or NaN"
        w_bad = c.weights is not None and not torch.isfinite(c.weights).all()
        out_bad = c.out is not None and not torch.isfinite(c.out).all()
        if s is not None:
            dead = (s == -inf).all(-1)   # rows with no finite score
            dead32 = (c32.scores == -inf).all(-1) if c32 is not None and c32.scores is not None \
                and c32.scores.shape == s.shape else None
            if dead.any() and dead32 is not None and (dead & ~dead32).any():
                return "mask_fill_overflow", (f"{where}: {int((dead & ~dead32).sum())} row(s) all -inf in {_name(dt)} "
                                              f"where {_name(calls32[i].scores.dtype)} keeps a finite fill "
                                              f"(finfo.min + a score below -{big * torch.finfo(dt).eps / 4:.3g} rounds to -inf)")
            if dead.any() and w_bad:
                return "fully_masked_row", f"{where}: a row with no visible key is all -inf and its softmax NaN"
            if w_bad:
                return "softmax_low_precision", f"{where}: finite scores, non-finite weights: the softmax overflowed in {_name(dt)}"
        elif out_bad and c.visible is not None:   # SDPA: which rows went non-finite
            rows = ~torch.isfinite(c.out).all(-1)
            blind = ~c.visible.expand(c.out.shape[:-1] + (c.k.shape[-2],)).any(-1)
            if not (rows & ~blind).any():
                fine32 = c32 is not None and c32.out is not None and bool(torch.isfinite(c32.out[rows]).all())
                return ("mask_fill_overflow" if fine32 else "fully_masked_row",
                        f"{where}: non-finite only in rows with no visible key"
                        + (f", finite there in {_name(c32.out.dtype)}" if fine32 else ""))
            return "scores_overflow", f"{where}: SDPA's output is non-finite in rows that see keys"
        if out_bad:
            return "output_overflow", f"{where}: finite weights, non-finite weights @ v"
    return "outside_attention", "every attention call is finite: the overflow is elsewhere (an MLP, a norm, the logits)"


def _largest_finite(finite, lo: float, hi: float, steps: int = 6) -> float:
    """Bisection in log scale: the largest score in [lo, hi] at which finite(score) holds, given
    finite(lo) and not finite(hi)."""
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if finite(mid) else (lo, mid)
    return lo


def _textbook_finite(calls, init, dt, g: float) -> bool:
    """The textbook attention (q scaled first, q k^T in dt, softmax in float32, weights @ v in dt)
    on the calls' own q, k, v with every score times g: every visible row finite?"""
    for i, c in enumerate(calls):
        if not c.complete:
            continue
        vis = init[i].visible if c.source == "softmax" and i < len(init) and init[i].source == "softmax" else c.visible
        q, k = (c.q.double() * (math.sqrt(g) * c.scale)).to(dt), (c.k.double() * math.sqrt(g)).to(dt)
        s = (q @ k.transpose(-2, -1)).float()
        if c.bias is not None:
            s = s + c.bias.float()
        live = torch.ones(s.shape[:-1], dtype=torch.bool, device=s.device)
        if vis is not None:
            v_ = vis.expand_as(s)
            s, live = s.masked_fill(~v_, float("-inf")), v_.any(-1)
        w = torch.softmax(s, dim=-1)
        out = w.to(dt) @ c.v.to(dt)
        if not torch.isfinite(out[live]).all():
            return False
    return True


def _size(ctx, amp, lp, auto, dt, first) -> tuple[str, str]:
    """(cause, the sizes in words) of the first failing low-precision run: the pattern, the
    largest score at which lp stays finite on that run's batch, and the textbook reference's on
    the same q, k, v (scores: the largest |visible score| of that batch in the target's own
    precision)."""
    label, a, (xx, m) = first
    if label == "raised":
        return "raised_in_low_precision", "a plain batch raised"
    try:
        _, calls = _run(ctx, a, lp, auto, xx, m, calls=True)
        _, calls32 = _run(ctx, a, ctx.adapter, None, xx, m, calls=True)
        cause, why = _cause(calls, calls32, dt)
    except Exception as e:   # the verdict stands; only the attribution failed
        return "unattributed", f"cause not found ({type(e).__name__}: {str(e)[:80]})"
    if isinstance(amp, str):
        return cause, why + f"; sizes not measured ({amp})"
    init = ctx.probe(xx, m)[1]
    ref_calls = amp.probe(ctx, xx, m)[1]
    unit = _max_score(ref_calls, init) / amp.reached   # this batch's largest score per calibrated unit

    def finite(score):
        y = _run(ctx, amp.scaled_to(score / unit), lp, auto, xx, m)
        return bool(torch.isfinite(y if m is None else y[m]).all())
    top = (a.reached if a is not None else amp.reached / amp.factor ** 2) * unit
    if a is None:
        mine = f"not finite even at init (largest score {top:.3g})"
    elif amp.capped:
        mine = f"not finite at its capped scores (largest {top:.3g})"
    else:
        lo = AMP_MODERATE * unit if a.reached > AMP_MODERATE * 1.01 else amp.reached / amp.factor ** 2 * unit
        mine = f"finite up to scores ~{_largest_finite(finite, lo, top):.3g}"
    if not any(c.complete for c in ref_calls):
        ref = "the textbook reference not measured (q, k, v of the calls not seen)"
    else:
        r = amp.reached * unit
        test = lambda score: _textbook_finite(ref_calls, init, dt, score / r)
        hi = r
        while test(hi) and hi < 1e9:
            hi *= 4
        ref = ("not finite at these scores either" if not test(r) else
               f"up to ~{_largest_finite(test, hi / 4, hi):.3g}" if not test(hi) else "beyond 1e9")
        ref = f"the textbook reference (q scaled first, softmax in float32) on the same q, k, v {ref}"
    return cause, f"{why}; {_name(dt)}: {mine}, {ref}"


def low_precision(ctx):
    if ctx.deterministic is False:
        return not_repeatable("low_precision")
    amp = amplifier(ctx)
    x = ctx.sample(k=40)
    padded = ctx.left_padded(k=41)
    parts, bad, worst_ratio, nonfinite_any, not_run = [], [], 0.0, False, []
    ratios, cause, size = 0, "", ""
    for dt in LOW:
        try:
            lp = ctx.adapter.converted(dtype=dt)
        except Exception as e:   # a module that cannot be converted
            parts.append(f"{_name(dt)}: cannot convert the target ({type(e).__name__})")
            not_run.append(f"{_name(dt)} (the target could not be converted)")
            continue
        for mode, target, auto in (("weights", lp, None), ("autocast", ctx.adapter, dt)):
            found, first = _nonfinite(ctx, amp, target, auto, x, padded)
            nonfinite_any |= bool(found)
            parts.append(f"{_name(dt)} {mode}: " + (", ".join(found) if found else "finite"))
            if found:
                bad.append(f"{_name(dt)} {mode}")
                if not cause:   # the first failing run says which pattern broke, and its size
                    cause, size = _size(ctx, amp, target, auto, dt, first)
                    size = f"{_name(dt)} {mode}: {size}"
        try:
            errs = _call_errors(ctx, lp, x)
        except TargetRaised:   # reported above, as the plain batch raising
            errs = []
        ratio = max((e_t / max(e_r, torch.finfo(dt).eps) for e_t, e_r in errs), default=None)
        if ratio is not None:
            ratios += 1
            worst_ratio = max(worst_ratio, ratio)
            if ratio > LOW_PRECISION_RATIO:
                bad.append(f"{_name(dt)} error")
                cause = cause or "error_ratio"
        parts.append(f"{_name(dt)} attention error / reference attention's, worst of {len(errs)} call(s): "
                     + (f"{ratio:.3g}" if ratio is not None else "n/a (q, k, v of the calls not seen)"))
    missing = ([f"amplified q.k ({amp})"] if isinstance(amp, str) else []) + \
        (["q, k, v of the calls for the error ratio"] if not ratios else []) + not_run
    tol = f"finite; error <= {LOW_PRECISION_RATIO:g}x ref"
    if not bad and missing:   # what ran passed, but not all of it could run: never a pass
        why = "needs " + "; ".join(missing)
        if isinstance(amp, str):
            return not_amplified("low_precision", amp, why, detail="; ".join(parts))
        return inconclusive("low_precision", why, "part_not_run", None, tol, "; ".join(parts))
    detail = "; ".join(parts)
    if bad:
        detail = f"cause {cause}: {CAUSES.get(cause, '')}" + (f" ({size})" if size else "") + "; " + detail
    return row("low_precision", "fail" if bad else "pass", math.inf if nonfinite_any else worst_ratio, tol,
               detail, cause)


def _at(ctx, adapter, x, offset, autocast=False):
    """Outputs at positions offset.., with q and k unit-variance (scores of std ~1 make the
    outputs depend on the positions; at init they barely do); autocast: under bfloat16 autocast."""
    pos = torch.arange(offset, offset + x.shape[1], device=adapter.device).expand(x.shape[0], -1)
    amp = torch.autocast(adapter.device.type, dtype=torch.bfloat16) if autocast else nullcontext()
    with unit_qk(ctx, adapter), amp:
        return ctx.run(x, positions=pos, adapter=adapter).float()


def _per_query_residual(ctx, adapter, x):
    """Scores at +LONG_OFFSET against those at +0, each query's row fitted by one factor (least
    squares over its visible keys): the largest residual relative to the call's largest score, or
    None where the calls' scores are not seen. A temperature that depends on the query's position
    leaves 0; a rotary phase error, which differs from key to key, does not."""
    calls = []
    for o in (0, LONG_OFFSET):
        pos = torch.arange(o, o + x.shape[1], device=adapter.device).expand(x.shape[0], -1)
        with unit_qk(ctx, adapter):
            calls.append(ctx.probe(x, positions=pos, adapter=adapter)[1])
    pairs = [(c0, c1) for c0, c1 in zip(*calls) if c0.weights is not None or c0.complete]
    if not pairs or len(calls[0]) != len(calls[1]):
        return None
    worst = 0.0
    for c0, c1 in pairs:
        s0, s1 = c0.seen_scores().double(), c1.seen_scores().double()
        vis = torch.isfinite(s0) & torch.isfinite(s1)
        if c0.visible is not None:
            vis &= c0.visible.expand_as(s0)
        s0, s1 = s0.masked_fill(~vis, 0.0), s1.masked_fill(~vis, 0.0)
        f = (s0 * s1).sum(-1, keepdim=True) / (s0 * s0).sum(-1, keepdim=True).clamp_min(1e-300)
        worst = max(worst, float((s1 - f * s0).abs().max()) / max(float(s0.abs().max()), 1e-30))
    return worst


def long_positions(ctx):
    a = ctx.adapter
    if a.kind != "lm":
        return na("long_positions", "needs positions (a layer takes none)")
    if ctx.deterministic is False:
        return not_repeatable("long_positions")
    if a.max_len is not None and a.max_len < LONG_OFFSET + ctx.T:
        return na("long_positions", f"needs positions up to {LONG_OFFSET + ctx.T} (takes {a.max_len})")
    x = ctx.sample(k=50)
    if a.positions_move_cache:
        return long_positions_through_cache(ctx, a, x)
    try:
        y0 = _at(ctx, a, x, 0)
        d_small = rel(_at(ctx, a, x, 16), y0)
    except Unsupported as e:
        return unsupported("long_positions", e)
    except TargetRaised as e:   # it may have the failure; the doctor cannot shift it there
        return inconclusive("long_positions", f"the target raised on positions 16.. ({e})", "unreachable")
    parts, bad, measured, cause = [], False, 0.0, ""
    if d_small <= ABSOLUTE_POS:   # relative positions: outputs must not move with a shift
        d_long = rel(_at(ctx, a, x, LONG_OFFSET), y0)
        measured = d_long
        parts.append(f"{_name(a.dtype)}: outputs at +{LONG_OFFSET} against +0: {d_long:.3g} (at +16: {d_small:.3g})")
        if d_long > LONG_REL and d_long <= LONG_BF16_RATIO * d_small + LONG_REL:
            # no growth with the distance (a recurrence reset at position 0): a phase error grows
            parts.append(f"but the change at +{LONG_OFFSET} is no more than 2x that at +16 + {LONG_REL:g}: a "
                         "dependence on the start position by design, not a precision loss growing with it")
            measured = d_long - LONG_BF16_RATIO * d_small
        elif d_long > LONG_REL:
            r = _per_query_residual(ctx, a, x)
            if r is not None and r <= LONG_REL:   # a temperature by position (Llama 4's, Beam's), by design
                measured = r
                parts.append(f"but the scores at +{LONG_OFFSET} are those at +0 times one factor per query "
                             f"(residual {r:.3g}): a position-dependent temperature, not a phase error")
            else:
                bad, cause = True, "shift_moves_outputs"
                if r is not None:
                    parts.append(f"the scores at +{LONG_OFFSET} are not those at +0 times a factor per query "
                                 f"(residual {r:.3g})")
    else:
        parts.append(f"absolute positions (outputs at +16 differ by {d_small:.3g}): no shift invariance to test")
    return bfloat16_half(a, lambda lo, o, auto: _at(ctx, lo, x, o, auto), rel, "", bad, measured, cause, parts)


CHECKS = (
    Check(low_precision, does="float16 and bfloat16, weights cast and under autocast, at init and with scores ~1e3 "
                              "and ~3e4, plain and left-padded; each call's error against float64 on its own q, k, v; "
                              "on a fail, the first failing run's attention calls name the pattern, and bisection "
                              "measures the largest score at which the target stays finite beside the textbook "
                              "reference's on the same q, k, v",
          fails_when="a real output is not finite, or a call's error exceeds twice that of the textbook attention in "
                     "the same dtype",
          tolerance="FlashAttention's rule (2x the reference's error); ~1e3 makes `finfo.min + score` overflow in "
                    "float16, ~3e4 makes an unscaled `q k^T` pass 65504",
          applies="targets whose scores the doctor sees and can amplify (at init: every target)",
          thread="pytorch/pytorch #60939", targets=("qk_fp16_overflow", "mask_min_overflow"), causes=CAUSES),
    Check(long_positions, does="outputs at positions +4096 against +0 (q, k made unit-variance so positions matter); "
                               "bfloat16 (weights and autocast) error against float64 at +0 and +4096; where positions "
                               "are a KV cache's write offset (start_pos, LitGPT's input_pos), the first attention "
                               "call's scores among the new tokens instead of the outputs (they also read the "
                               "cache's empty slots)",
          fails_when="the shift moves the outputs (targets whose outputs do not move at +16), more than 2x + 1e-3 "
                     "what +16 moves them (a change that does not grow with the distance is a start-of-sequence "
                     "dependence by design: RecurrentGemma resets at position 0), and the scores at +4096 are not "
                     "those at +0 times one factor per query (a temperature by position, Llama 4's or Beam's, is by "
                     "design); or the bfloat16 error at +4096 exceeds 2x that at +0 + 0.005",
          tolerance="1e-3 (also for the per-query fit's residual: float32 phases at 4096 are good to ~2.5e-4 rad; "
                    "bfloat16 phases leave 0.8); measured on 27 healthy runs: shift 1.4e-7..7.1e-6, bf16 error ratio "
                    "0.69..1.66",
          applies="LMs that take position ids up to 4112 (a layer takes none)",
          thread="huggingface/transformers #29496", targets=("rope_low_precision",),
          causes={"shift_moves_outputs": "outputs move with a shift of every position (rotary phases that lose "
                                         "precision as positions grow)",
                  "bfloat16_error_grows": "the bfloat16 error at +4096 grows past 2x that at +0 (phases computed "
                                          "in bfloat16, e.g. under autocast)"}),
)
