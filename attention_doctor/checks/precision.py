"""Low precision (float16, bfloat16) and long positions."""
import math
from contextlib import nullcontext

import torch

from attention_doctor.adapters import Unsupported
from attention_doctor.checks.amplified import amplifier
from attention_doctor.checks.cached_positions import long_positions_through_cache
from attention_doctor.checks.common import (ABSOLUTE_POS, AMP_MODERATE, LONG_BF16_FLOOR, LONG_BF16_RATIO, LONG_OFFSET, LONG_REL,
                                            LOW_PRECISION_RATIO, TargetRaised, rel, row, skip)
from attention_doctor.checks.scale import unit_qk

LOW = (torch.float16, torch.bfloat16)


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


def _nonfinite(ctx, amp, lp, autocast_dt, x, padded) -> list[str]:
    """Non-finite real outputs of `lp` on a plain and a left-padded batch, at init and with the
    scores amplified to ~1e3 (finfo.min + a score below -16 overflows to -inf in float16) and to
    ~3e4 (q k^T before the scale passes 65504 in float16). autocast_dt: run under autocast."""
    found = []
    levels = [("", None)]
    if not isinstance(amp, str):
        levels += [(" at scores ~1e3", amp.scaled_to(AMP_MODERATE)), (" at scores ~3e4", amp)]
    for label, (xx, m) in (("plain", (x, None)), ("left-padded", padded)):
        for lvl, a in levels:
            cast = torch.autocast(lp.device.type, dtype=autocast_dt) if autocast_dt else nullcontext()
            try:
                with cast:
                    y = a.probe(ctx, xx, m, adapter=lp)[0] if a is not None else ctx.run(xx, m, adapter=lp)
            except Unsupported:
                continue
            except TargetRaised as e:
                if m is None:   # a plain batch the target cannot run in this precision
                    found.append(f"{label}{lvl} raised {e}")
                continue        # a mask the target rejects is padding's failure
            n = int((~torch.isfinite(y if m is None else y[m])).sum())
            if n:
                found.append(f"{n} non-finite {label}{lvl}")
    return found


def low_precision(ctx):
    if ctx.deterministic is False:
        return skip("low_precision", "eval outputs are not repeatable (see eval_dropout)")
    amp = amplifier(ctx)
    x = ctx.sample(k=40)
    padded = ctx.left_padded(k=41)
    parts, bad, worst_ratio, nonfinite_any = [], [], 0.0, False
    for dt in LOW:
        try:
            lp = ctx.adapter.converted(dtype=dt)
        except Exception as e:   # a module that cannot be converted
            parts.append(f"{_name(dt)}: cannot convert the target ({type(e).__name__})")
            continue
        for mode, target, auto in (("weights", lp, None), ("autocast", ctx.adapter, dt)):
            found = _nonfinite(ctx, amp, target, auto, x, padded)
            nonfinite_any |= bool(found)
            parts.append(f"{_name(dt)} {mode}: " + (", ".join(found) if found else "finite"))
            if found:
                bad.append(f"{_name(dt)} {mode}")
        try:
            errs = _call_errors(ctx, lp, x)
        except TargetRaised:   # reported above, as the plain batch raising
            errs = []
        ratio = max((e_t / max(e_r, torch.finfo(dt).eps) for e_t, e_r in errs), default=None)
        if ratio is not None:
            worst_ratio = max(worst_ratio, ratio)
            if ratio > LOW_PRECISION_RATIO:
                bad.append(f"{_name(dt)} error")
        parts.append(f"{_name(dt)} attention error / reference attention's, worst of {len(errs)} call(s): "
                     + (f"{ratio:.3g}" if ratio is not None else "n/a (q, k, v of the calls not seen)"))
    missing = ([f"amplified q.k ({amp})"] if isinstance(amp, str) else []) + \
        (["q, k, v of the calls for the error ratio"] if not worst_ratio and not any("call(s)" in p for p in parts) else [])
    tol = f"finite; error <= {LOW_PRECISION_RATIO:g}x ref"
    if not bad and missing:   # what ran passed, but not all of it could run: never a pass
        return row("low_precision", "skip: needs " + "; ".join(missing), None, tol, "; ".join(parts))
    return row("low_precision", "fail" if bad else "pass", math.inf if nonfinite_any else worst_ratio, tol,
               "; ".join(parts))


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
        return skip("long_positions", "needs positions (a layer takes none)")
    if ctx.deterministic is False:
        return skip("long_positions", "eval outputs are not repeatable (see eval_dropout)")
    if a.max_len is not None and a.max_len < LONG_OFFSET + ctx.T:
        return skip("long_positions", f"needs positions up to {LONG_OFFSET + ctx.T} (takes {a.max_len})")
    x = ctx.sample(k=50)
    if a.positions_move_cache:
        return long_positions_through_cache(ctx, a, x)
    try:
        y0 = _at(ctx, a, x, 0)
        d_small = rel(_at(ctx, a, x, 16), y0)
    except Unsupported as e:
        return skip("long_positions", str(e))
    except TargetRaised as e:
        return skip("long_positions", f"the target does not take positions {LONG_OFFSET}.. ({e})")
    parts, bad, measured = [], False, 0.0
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
                bad = True
                if r is not None:
                    parts.append(f"the scores at +{LONG_OFFSET} are not those at +0 times a factor per query "
                                 f"(residual {r:.3g})")
    else:
        parts.append(f"absolute positions (outputs at +16 differ by {d_small:.3g}): no shift invariance to test")
    # in bfloat16 (weights cast, and float32 weights under autocast, as mixed-precision training
    # runs): the error against float64 at +4096 must stay near the error at +0
    try:
        hi = a.converted(dtype=torch.float64)
        ref = {o: _at(ctx, hi, x, o) for o in (0, LONG_OFFSET)}
        runs = (("bfloat16 weights", a.converted(dtype=torch.bfloat16), False), ("bfloat16 autocast", a, True))
        for label, lo, auto in runs:
            e = [rel(_at(ctx, lo, x, o, auto), ref[o]) for o in (0, LONG_OFFSET)]
            lim = LONG_BF16_RATIO * e[0] + LONG_BF16_FLOOR
            bad |= e[1] > lim
            measured = max(measured, e[1]) if e[1] > lim else measured
            parts.append(f"{label}: error against float64 at +0 {e[0]:.3g}, at +{LONG_OFFSET} {e[1]:.3g} (limit {lim:.3g})")
    except (Unsupported, TargetRaised, RuntimeError, TypeError) as ex:
        parts.append(f"bfloat16: n/a ({type(ex).__name__}: {str(ex)[:80]})")
    return row("long_positions", "fail" if bad else "pass", measured,
               f"<= {LONG_REL:g}; bf16 <= {LONG_BF16_RATIO:g}x + {LONG_BF16_FLOOR:g}",
               "; ".join(parts))
