"""Low precision (float16, bfloat16) and long positions."""
import math
from contextlib import nullcontext

import torch

from attention_doctor.checks.amplified import FILLS, _max_score, amplifier
from attention_doctor.checks.cached_positions import long_positions_through_cache, with_bfloat16
from attention_doctor.checks.catalogue import BY_NAME
from attention_doctor.checks.common import (
    ABSOLUTE_POS,
    AMP_MODERATE,
    AMP_TARGET,
    LONG_BF16_RATIO,
    LONG_OFFSET,
    LONG_REL,
    LOW_PRECISION_RATIO,
    finite_max_abs,
    inconclusive,
    judged,
    na,
    rel,
)
from attention_doctor.checks.scale import unit_qk
from attention_doctor.result import NA
from attention_doctor.signals import NotPerformed, Signal, TargetRaised, Unreachable, Unsupported, said
from attention_doctor.state_writes import state_write_raised

LOW = (torch.float16, torch.bfloat16)
CAUSES = BY_NAME["low_precision"].causes   # which pattern broke (docs/doctor.md explains the first with numbers)


def _name(dt):
    return str(dt).replace("torch.", "")


def _call_errors(ctx, lp, x):
    """Per attention call of the target in low precision: (its error, the reference attention's
    error in the same dtype), both against float64 on the call's own q, k, v, over the rows that
    see a key; and how many calls could not be compared (float64's reference not finite there)."""
    _, calls = ctx.probe(x, adapter=lp)
    out, uncompared = [], 0
    for c in calls:
        if not c.complete:
            continue
        ref = c.reference(torch.float64)
        live = torch.ones(ref.shape[:-1], dtype=torch.bool, device=ref.device)
        if c.visible is not None:   # rows with a visible key (the reference returns 0 otherwise)
            live = c.visible.expand(ref.shape[:-1] + (c.k.shape[-2],)).any(-1)
        if not bool(torch.isfinite(ref[live]).all()):
            uncompared += 1
            continue
        out.append((rel(c.out[live], ref[live]), rel(c.reference(c.q.dtype)[live], ref[live])))
    return out, uncompared


def _levels(amp):
    """(label, the score aimed at (None: at init), amplifier or None) in rising order: at init, scores
    ~1e3 (finfo(float16).min + a score below -16 overflows to -inf), ~3e4 (an unscaled q k^T passes
    65504 in float16); for capped scores, at init and at the most the target's scores reach."""
    if not isinstance(amp, Signal) and amp.capped:
        return [("", None, None), (f" at its capped scores ~{amp.reached:.3g}", amp.reached, amp)]
    if isinstance(amp, Signal):
        return [("", None, None)]
    # the amplifier lands anywhere in [AMP_LO, AMP_HI] (a bias beside q . k, ALiBi's, keeps the first try
    # short of its aim): below ~3e4 an unscaled q k^T of d = 16 (x 4) stays under 65504, so that level is aimed again
    top = amp if amp.reached >= AMP_TARGET else amp.scaled_to(AMP_TARGET)
    return [("", None, None), (" at scores ~1e3", AMP_MODERATE, amp.scaled_to(AMP_MODERATE)),
            (" at scores ~3e4", AMP_TARGET, top)]


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


def _nonfinite(ctx, amp, lp, autocast_dt, x, padded, run):
    """Non-finite real outputs of `lp` on a plain and a left-padded batch at each of _levels(amp),
    lowest first. Returns (what was found, in words; the same as records, `run` ({dtype, mode})
    and the batch and score added to each; the first failing run: (label, amplifier, batch) or
    None; {the batches that could not run ("": every one): why}). A batch that raises is found too
    ("raised": the plain one, or the left-padded one where the target runs it in its own precision);
    a target that takes no padding mask has no left-padded runs (by nature). Under autocast, a raise
    on writing into the target's own state (state_write_raised) leaves the mode not run."""
    found, records, first, not_run = [], [], None, {}
    own = {}   # does the target run the left-padded batch in its own precision (asked once)

    def runs_own(xx, m) -> bool:
        if "ok" not in own:
            try:
                ctx.run(xx, m)
                own["ok"] = True
            except (TargetRaised, Unsupported):
                own["ok"] = False
        return own["ok"]

    for lvl, aim, a in _levels(amp):
        for label, batch, (xx, m) in (("plain", "plain", (x, None)), ("left-padded", "left_padded", padded)):
            try:
                y = _run(ctx, a, lp, autocast_dt, xx, m)
            except Unreachable as e:
                not_run.setdefault(batch, e.why)
                continue
            except Unsupported:
                continue
            except TargetRaised as e:
                limit = autocast_dt and state_write_raised(lp.module, lambda: _run(ctx, a, lp, autocast_dt, xx, m))
                if limit:   # its state's dtype is fixed at set-up: autocast cannot look, its weights run can
                    return found, records, first, {"": limit}
                if e.asserted and m is None:   # its author's contract (nanochat asserts its rotary dtype)
                    return found, records, first, {"": f"the target asserts against running so ({e.error}): "
                                                       "it runs in this precision only as its own code sets up"}
                if m is None or runs_own(xx, m):   # a batch it runs in its own precision raises in this one
                    found.append(f"{label}{lvl} raised {e.error}")
                    records.append({**run, "batch": batch, "scores": aim, "raised": e.error})
                    first = first or ("raised", a, (xx, m))
                else:           # a mask the target rejects in any precision: those runs did not run
                    not_run.setdefault(batch, f"the target raised on them: {e.error}")
                continue
            n = int((~torch.isfinite(y if m is None else y[m])).sum())
            if n:
                found.append(f"{n} non-finite {label}{lvl}")
                records.append({**run, "batch": batch, "scores": aim, "nonfinite": n})
                first = first or (lvl, a, (xx, m))
    return found, records, first, not_run


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
            elif c.q is not None and c.k is not None and c.extra.get("summed") and c32 is not None \
                    and c32.scores is not None:   # scores that sum q k^T and other terms: no one scale
                raw, scaled = _qk(c), _largest_score(c32.scores)
                if raw > big >= scaled:
                    return "qk_before_scale", (f"{where}: max |q.k| {raw:.3g} passes {_name(dt)}'s {big:.5g}, while "
                                               f"the scores it is summed into reach {scaled:.3g} in "
                                               f"{_name(c32.scores.dtype)} (in range): formed before the scale")
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


def _largest_score(s) -> float:
    """The largest finite |score| that is not a mask's fill (FILLS: finfo.min, -1e30)."""
    s = s.detach().double()
    return finite_max_abs(s[s.abs() < FILLS])


def _largest_finite(finite, lo: float, hi: float, steps: int = 6) -> float:
    """Bisection in log scale: the largest score in [lo, hi] at which finite(score) holds, given
    finite(lo) and not finite(hi)."""
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if finite(mid) else (lo, mid)
    return lo


def _textbook_finite(calls, init, dt, g: float) -> bool:
    """The textbook attention (q scaled first, q k^T in dt, softmax in float32, weights @ v in dt)
    on the calls' own q, k, v with every score times g (a call whose scores add other terms to q k^T:
    its scores times g, rounded to dt): every visible row finite?"""
    for i, c in enumerate(calls):
        if not c.complete:
            continue
        vis = init[i].visible if c.source == "softmax" and i < len(init) and init[i].source == "softmax" else c.visible
        if c.scale is None:
            s = (c.scores.double() * g).to(dt).float()
        else:
            q, k = (c.q.double() * (math.sqrt(g) * c.scale)).to(dt), (c.k.double() * math.sqrt(g)).to(dt)
            s = (q @ k.transpose(-2, -1)).float()
        if c.bias is not None:
            s = s + c.bias.float()
        live = torch.ones(s.shape[:-1], dtype=torch.bool, device=s.device)
        if vis is not None:
            v_ = vis.expand_as(s)
            s, live = s.masked_fill(~v_, float("-inf")), v_.any(-1)
        w = c.normalised(s)
        out = w.to(dt) @ c.v.to(dt)
        if not torch.isfinite(out[live]).all():
            return False
    return True


def _size(ctx, amp, lp, auto, dt, first) -> tuple[str, str, dict]:
    """(cause, the sizes in words, the sizes as measurements) of the first failing low-precision
    run: the pattern, the largest score at which lp stays finite on that run's batch, and the
    textbook reference's on the same q, k, v (scores: the largest |visible score| of that batch in
    the target's own precision)."""
    label, a, (xx, m) = first
    sizes = {"finite_up_to": None, "reference_finite_up_to": None}
    if label == "raised":
        batch = "a plain batch" if m is None else "a left-padded batch it runs in its own precision"
        return "raised_in_low_precision", f"{batch} raised", sizes
    try:
        _, calls = _run(ctx, a, lp, auto, xx, m, calls=True)
        _, calls32 = _run(ctx, a, ctx.adapter, None, xx, m, calls=True)
        cause, why = _cause(calls, calls32, dt)
        if isinstance(amp, Signal):
            return cause, why + f"; sizes not measured ({amp.why})", sizes
        init = ctx.probe(xx, m)[1]
        ref_calls = amp.probe(ctx, xx, m)[1]
        unit = _max_score(ref_calls, init) / amp.reached   # this batch's largest score per calibrated unit

        def finite(score):
            y = _run(ctx, amp.scaled_to(score / unit), lp, auto, xx, m)
            return bool(torch.isfinite(y if m is None else y[m]).all())
        top = (a.reached if a is not None else amp.reached / amp.factor ** 2) * unit
        if a is None:
            mine = f"not finite even at init (largest score {top:.3g})"
        elif amp.capped:   # no larger score to bisect towards: the cap is the stress
            mine = f"not finite at its capped scores (largest {top:.3g})"
        else:
            lo = AMP_MODERATE * unit if a.reached > AMP_MODERATE * 1.01 else amp.reached / amp.factor ** 2 * unit
            sizes["finite_up_to"] = _largest_finite(finite, lo, top)
            mine = f"finite up to scores ~{sizes['finite_up_to']:.3g}"
        if not any(c.complete for c in ref_calls):
            ref = "the textbook reference not measured (q, k, v of the calls not seen)"
        else:
            r = amp.reached * unit
            test = lambda score: _textbook_finite(ref_calls, init, dt, score / r)
            hi = r
            while test(hi) and hi < 1e9:
                hi *= 4
            if not test(r):
                ref, sizes["reference_finite_up_to"] = "not finite at these scores either", None
            elif not test(hi):
                sizes["reference_finite_up_to"] = _largest_finite(test, hi / 4, hi)
                ref = f"up to ~{sizes['reference_finite_up_to']:.3g}"
            else:
                ref, sizes["reference_finite_up_to"] = "beyond 1e9", math.inf
            ref = f"the textbook reference (q scaled first, softmax in float32) on the same q, k, v {ref}"
    except Signal as e:   # the fail stands; only its attribution could not be made
        return "unattributed", f"cause not found ({e.why[:80]})", sizes
    except Exception as e:  # noqa: BLE001 -- the attribution's own code raised: the fail stands, its cause `unattributed` says so (not a pass, not a doctor_error row)
        return "unattributed", f"cause not found ({type(e).__name__}: {str(e)[:80]})", sizes
    return cause, f"{why}; {_name(dt)}: {mine}, {ref}", sizes


def _overflow_error(c, c32, c0, dt) -> tuple[float, float] | None:
    """(the call's output error against float64, the textbook's in dt) where its scores hold inf or
    NaN that the same call in the target's own precision (c32) has finite and inside dt's range; None
    elsewhere, or where the call cannot be recomputed (its scores not q k^T times one scale plus
    terms read from c32: the mask, a bias, an offset). float64: q k^T formed there, times the scale,
    plus those terms; the textbook: q scaled first, q k^T in dt, the terms and the normalisation in
    float32 (as _textbook_finite). c0: the same call at init, whose visible keys are the mask."""
    if c.source not in ("softmax", "handmade") or c32 is None or not (c.complete and c32.complete):
        return None
    if c.scores is None or c32.scores is None or c.scores.shape != c32.scores.shape:
        return None
    s, s32 = c.scores.double(), c32.scores.double()
    if not bool((~torch.isfinite(s) & torch.isfinite(s32) & (s32.abs() <= torch.finfo(dt).max)).any()):
        return None
    scale = c32.scale or c.scale
    prod, prod32 = (t.q.double() @ t.k.double().transpose(-2, -1) for t in (c, c32))
    if not scale or prod.shape != s.shape or prod32.shape != s.shape:
        return None
    rest = s32 - prod32 * scale   # what the target adds to q k^T: its mask, a bias, a row offset
    vis = c0.visible if c0 is not None and c0.visible is not None else c32.visible
    vis = torch.ones_like(s, dtype=torch.bool) if vis is None else vis.expand_as(s)
    live = vis.any(-1)

    def attend(scores, v):
        w = c.normalised(scores.masked_fill(~vis, float("-inf"))).masked_fill(~live[..., None], 0.0)
        return w.to(v.dtype) @ v
    truth = attend(prod * scale + rest, c.v.double())
    q, k = (c.q.double() * scale).to(dt), c.k.to(dt)
    textbook = attend((q @ k.transpose(-2, -1)).float() + rest.float(), c.v.to(dt))
    if truth.shape != c.out.shape or not bool(torch.isfinite(truth[live]).all()):
        return None
    return rel(c.out[live], truth[live]), rel(textbook[live], truth[live])


def _hidden_overflow(ctx, amp, lp, auto, x, dt, own):
    """Where the low-precision outputs stayed finite at every level: at each amplified level, the
    first attention call whose scores overflowed (inf or NaN where its own precision's are finite,
    in dt's range) and whose output is off float64 by more than LOW_PRECISION_RATIO times the
    textbook's error: an overflow the normalisation kept finite (a sigmoid's weight 1, a masked key
    at +inf past its finfo.min fill) that the outputs' values show. (cause, what shows it, what was
    seen, the measurement) or None. own: the plain batch's calls in the target's own precision, per level."""
    if isinstance(amp, Signal):
        return None
    if "init" not in own:
        own["init"] = ctx.probe(x)[1]
    init = own["init"]
    for lvl, aim, a in _levels(amp)[1:]:
        if aim not in own:
            own[aim] = _run(ctx, a, ctx.adapter, None, x, None, calls=True)[1]
        try:
            calls = _run(ctx, a, lp, auto, x, None, calls=True)[1]
        except Signal:   # a run _nonfinite found raising or not run: reported there
            return None
        calls32 = own[aim]
        if len(calls) != len(calls32):
            continue
        for i, (c, c32) in enumerate(zip(calls, calls32)):
            c0 = init[i] if i < len(init) and init[i].source == c.source else None
            errs = _overflow_error(c, c32, c0, dt)
            if errs is None or errs[0] <= LOW_PRECISION_RATIO * max(errs[1], torch.finfo(dt).eps):
                continue
            seen = (f"finite{lvl}, but call {i} ({c.module or c.source}) has inf or NaN scores that "
                    f"{_name(c32.scores.dtype)} has in range and an output off float64 by {errs[0]:.3g} (the "
                    f"textbook's {errs[1]:.3g})")
            return (*_cause(calls, calls32, dt), seen,
                    {"scores": aim, "call": i, "error": errs[0], "textbook_error": errs[1]})
    return None


def low_precision(ctx):
    ctx.require_repeatable()
    amp = amplifier(ctx)
    x = ctx.sample(k=40)
    padded = ctx.left_padded(k=41)
    parts, bad, worst_ratio, nonfinite_any, not_run, runs = [], [], 0.0, False, {}, []
    ratios, uncompared, cause, size, sizes = {}, 0, "", "", {"finite_up_to": None, "reference_finite_up_to": None}
    hidden, own = [], {}   # overflows the outputs' finiteness hides; the target's own-precision calls per level
    for dt in LOW:
        try:
            lp = ctx.adapter.converted(dtype=dt)
        except Exception as e:  # noqa: BLE001 -- a module torch cannot copy or cast: this dtype's runs not run (inconclusive unless another fails)
            parts.append(f"{_name(dt)}: cannot convert the target ({type(e).__name__})")
            not_run[_name(dt)] = f"the target could not be converted ({said(e, 120)})"
            continue
        for mode, target, auto in (("weights", lp, None), ("autocast", ctx.adapter, dt)):
            found, records, first, skipped = _nonfinite(ctx, amp, target, auto, x, padded,
                                                        {"dtype": _name(dt), "mode": mode})
            runs += records
            nonfinite_any |= bool(found)
            parts.append(f"{_name(dt)} {mode}: " + (", ".join(found) if found else "finite"))
            for batch, why in skipped.items():   # "": the whole mode
                part = " ".join(filter(None, (_name(dt), mode, batch.replace("_", "-"))))
                parts[-1] += f" ({part}: not run, {why})"
                not_run[part] = why
            if found:
                bad.append(f"{_name(dt)} {mode}")
                if not cause:   # the first failing run says which pattern broke, and its size
                    cause, size, sizes = _size(ctx, amp, target, auto, dt, first)
                    size = f"{_name(dt)} {mode}: {size}"
            elif "" not in skipped and (h := _hidden_overflow(ctx, amp, target, auto, x, dt, own)) is not None:
                hidden.append({"dtype": _name(dt), "mode": mode, **h[3]})
                bad.append(f"{_name(dt)} {mode} values")
                parts[-1] = f"{_name(dt)} {mode}: {h[2]}"
                if not cause:
                    cause, size = h[0], f"{_name(dt)} {mode}: {h[1]}"
        try:
            errs, n_uncompared = _call_errors(ctx, lp, x)
        except TargetRaised:   # reported above, as the plain batch raising
            errs, n_uncompared = [], 0
        compared = [(e_t, e_r) for e_t, e_r in errs if math.isfinite(e_r)]   # the textbook in this dtype: finite
        uncompared += n_uncompared + len(errs) - len(compared)
        errs = compared
        ratio = max((e_t / max(e_r, torch.finfo(dt).eps) for e_t, e_r in errs), default=None)
        ratios[_name(dt)] = ratio
        if ratio is not None:
            worst_ratio = max(worst_ratio, ratio)
            if ratio > LOW_PRECISION_RATIO:
                bad.append(f"{_name(dt)} error")
                cause = cause or "error_ratio"
        parts.append(f"{_name(dt)} attention error / reference attention's, worst of {len(errs)} call(s): "
                     + (f"{ratio:.3g}" if ratio is not None else "n/a (q, k, v of the calls not seen)"))
    missing, na_parts = {}, []   # part -> what it needed, in words; the parts that do not apply by nature
    if isinstance(amp, Signal) and amp.outcome is NA:   # no attention weights at all: no scores, no calls
        na_parts = ["amplified_scores"] + (["error_ratio"] if all(r is None for r in ratios.values()) else [])
        parts.append(f"amplified scores and the error ratio: n/a, {amp.why}")
    elif isinstance(amp, Signal):
        missing["amplified_scores"] = f"amplified q.k ({amp.why})"
    if all(r is None for r in ratios.values()) and "error_ratio" not in na_parts:
        missing["error_ratio"] = "q, k, v of the calls for the error ratio"
    if uncompared:
        missing["error_ratio_references"] = (f"float64 references that are finite for the error ratio ({uncompared} "
                                             "call(s) not compared)")
    missing.update({part: f"{part} ({why})" for part, why in not_run.items()})
    tol = f"finite; error <= {LOW_PRECISION_RATIO:g}x ref"
    meas = dict(nonfinite_runs=runs, error_ratio=ratios, hidden_overflow=hidden, **sizes,
                **({"not_applicable": na_parts} if na_parts else {}))
    if not bad and missing:   # what ran passed, but not all of it could run: never a pass
        why = "needs " + "; ".join(missing.values())
        unamplified = isinstance(amp, Signal) and amp.outcome is not NA
        cause = amp.cause if unamplified else "part_not_run"
        return inconclusive(why, cause, None, tol, "; ".join(parts), **meas, not_run=sorted(missing))
    detail = "; ".join(parts)
    if bad:
        detail = f"cause {cause}: {CAUSES[cause].meaning}" + (f" ({size})" if size else "") + "; " + detail
    return judged(bool(bad), math.inf if nonfinite_any else worst_ratio, tol, detail, cause, **meas)


def _at(ctx, adapter, x, offset, autocast=False):
    """Outputs at positions offset.., with q and k unit-variance (scores of std ~1 make the
    outputs depend on the positions; at init they barely do); autocast: under bfloat16 autocast."""
    pos = torch.arange(offset, offset + x.shape[1], device=adapter.device).repeat(x.shape[0], 1)   # its own memory: a target may add to it in place (XGLM in 4.x)
    amp = torch.autocast(adapter.device.type, dtype=torch.bfloat16) if autocast else nullcontext()
    with unit_qk(ctx, adapter), amp:
        return ctx.run(x, positions=pos, adapter=adapter).float()


def _per_query_residual(ctx, adapter, x):
    """Scores at +LONG_OFFSET against those at +0, each query's row fitted by one factor (least
    squares over its visible keys): the largest residual relative to the call's largest score, or
    None where the calls' scores are not seen. A temperature that depends on the query's position
    leaves 0; a rotary phase error, which differs from key to key, does not. Scores at +4096 that
    are not finite where those at +0 are visible leave inf; those at +0 not finite: NotPerformed."""
    calls = []
    for o in (0, LONG_OFFSET):
        pos = torch.arange(o, o + x.shape[1], device=adapter.device).repeat(x.shape[0], 1)
        with unit_qk(ctx, adapter):
            calls.append(ctx.probe(x, positions=pos, adapter=adapter)[1])
    pairs = [(c0, c1) for c0, c1 in zip(*calls) if c0.weights is not None or c0.complete]
    if not pairs or len(calls[0]) != len(calls[1]):
        return None
    worst = 0.0
    for c0, c1 in pairs:
        s0, s1 = c0.seen_scores().double(), c1.seen_scores().double()
        if s0.shape != s1.shape:
            return math.inf
        vis = torch.ones_like(s0, dtype=torch.bool) if c0.visible is None else c0.visible.expand_as(s0)
        vis1 = torch.ones_like(s1, dtype=torch.bool) if c1.visible is None else c1.visible.expand_as(s1)
        if not bool(torch.isfinite(s0[vis]).all()):
            raise NotPerformed("the scores at +0 are not finite where visible: no fit holds", "reference_nonfinite")
        if not torch.equal(vis, vis1) or not bool(torch.isfinite(s1[vis]).all()):
            return math.inf
        s0, s1 = s0.masked_fill(~vis, 0.0), s1.masked_fill(~vis, 0.0)
        f = (s0 * s1).sum(-1, keepdim=True) / (s0 * s0).sum(-1, keepdim=True).clamp_min(1e-300)
        worst = max(worst, float((s1 - f * s0).abs().max()) / max(float(s0.abs().max()), 1e-30))
    return worst


def long_positions(ctx):
    a = ctx.adapter
    if a.kind != "lm":
        return na("needs positions (a layer takes none)", "no_positions")
    if a.max_len is not None and a.max_len < LONG_OFFSET + ctx.T:
        return na(f"needs positions up to {LONG_OFFSET + ctx.T} (takes {a.max_len})", "no_positions")
    ctx.require_repeatable()   # after every n/a: a missing interface is n/a whatever the noise
    x = ctx.sample(k=50)
    if a.positions_move_cache:
        return long_positions_through_cache(ctx, a, x)
    try:
        y0 = _at(ctx, a, x, 0)
        d_small = rel(_at(ctx, a, x, 16), y0, "the outputs at +0")
    except TargetRaised as e:   # it may have the failure; the doctor cannot shift it there
        return inconclusive(f"the target raised on positions 16.. ({e.error})", "unreachable", error=e.error)
    parts, bad, measured, cause, d_long, r = [], False, 0.0, "", None, None
    absolute = d_small > ABSOLUTE_POS
    if not absolute:   # relative positions: outputs must not move with a shift
        d_long = rel(_at(ctx, a, x, LONG_OFFSET), y0, "the outputs at +0")
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
    return with_bfloat16(ctx, a, lambda lo, o, auto: _at(ctx, lo, x, o, auto),
                         lambda got, ref: rel(got, ref, "the reference's outputs"), "", bad, measured, cause, parts,
                         through_cache=False, absolute_positions=absolute, shift_16=d_small, shift=d_long,
                         per_query_residual=r)
