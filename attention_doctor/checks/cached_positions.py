"""long_positions where positions are a KV cache's write offset (Meta's Llama `start_pos`, LitGPT's
`input_pos`): at +4096 the new tokens' queries also read the cache's 4096 empty slots, so their
outputs cannot be compared with those at +0. Their scores among themselves can: each new query
against the new keys, at the same relative offsets at +0 and at +4096, rows centred (a constant
per row, a softmax's maximum taken off, does not change the weights). The first attention call
only: the empty slots change its outputs, hence every later layer's q and k. And the bfloat16 half
long_positions shares with its outputs' version."""
import math
from contextlib import nullcontext

import torch

from attention_doctor.checks.common import (
    ABSOLUTE_POS,
    LONG_BF16_FLOOR,
    LONG_BF16_RATIO,
    LONG_OFFSET,
    LONG_REL,
    held_in_part,
    inconclusive,
    judged,
)
from attention_doctor.checks.scale import unit_qk
from attention_doctor.signals import NotPerformed, TargetRaised, Unsupported
from attention_doctor.state_writes import state_write_raised


def new_scores(ctx, adapter, x, offset, autocast=False) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """[(scores, visible)] of the first attention call: its T new queries against the T new keys
    (float64), at positions offset.., q and k unit-variance; [] if no call's scores were seen."""
    T = x.shape[1]
    pos = torch.arange(offset, offset + T, device=adapter.device).repeat(x.shape[0], 1)   # its own memory (see precision._at)
    cast = torch.autocast(adapter.device.type, dtype=torch.bfloat16) if autocast else nullcontext()
    with unit_qk(ctx, adapter), cast:
        _, calls = ctx.probe(x, positions=pos, adapter=adapter)
    for c in calls:
        if (c.scores is None and not c.complete) or c.q is None or c.q.shape[-2] != T:
            continue
        full = c.seen_scores().double()
        # the new keys: at the offset in a cache of fixed length (LitGPT), else the last T (Meta's)
        cols = slice(offset, offset + T) if full.shape[-1] >= offset + T and full.shape[-1] > T else slice(-T, None)
        s = full[..., cols]
        vis = torch.ones_like(s, dtype=torch.bool) if c.visible is None else c.visible.expand(full.shape)[..., cols]
        return [(s, vis)]
    return []


def _centred(s, vis):
    """s with each row's mean over its visible entries taken off, 0 where masked."""
    n = vis.sum(-1, keepdim=True).clamp_min(1)
    s = s.masked_fill(~vis, 0.0)
    return (s - s.sum(-1, keepdim=True) / n).masked_fill(~vis, 0.0)


def _pairs(a: list, b: list):
    """(a's centred scores, b's, the visible entries) per call; b is the reference: scores that are
    not finite where visible leave nothing to compare (NotPerformed); a's are inf there (a NaN is
    never agreement), and so is a call whose visible entries differ from b's."""
    for (sa, va), (sb, vb) in zip(a, b):
        if not bool(torch.isfinite(sb[vb]).all()):
            raise NotPerformed("the new tokens' scores at +0 are not finite where visible: no comparison holds",
                               "reference_nonfinite")
        if not torch.equal(va, vb) or not bool(torch.isfinite(sa[va]).all()):
            yield None
        else:
            yield _centred(sa, va), _centred(sb, vb), vb


def _rel(a: list, b: list) -> float:
    """The largest |a - b| over the calls' visible entries, relative to the largest |b|."""
    num, den = 0.0, 1e-30
    for p in _pairs(a, b):
        if p is None:
            return math.inf
        x, y, _ = p
        num, den = max(num, float((x - y).abs().max())), max(den, float(y.abs().max()))
    return num / den


def _per_query(a: list, b: list) -> float:
    """The residual of a fitted as b times one factor per query (a temperature by position)."""
    worst = 0.0
    for p in _pairs(a, b):
        if p is None:
            return math.inf
        x, y, _ = p
        f = (x * y).sum(-1, keepdim=True) / (y * y).sum(-1, keepdim=True).clamp_min(1e-300)
        worst = max(worst, float((x - f * y).abs().max()) / max(float(y.abs().max()), 1e-30))
    return worst


def long_positions_through_cache(ctx, a, x):
    try:
        s0 = new_scores(ctx, a, x, 0)
        s1 = new_scores(ctx, a, x, LONG_OFFSET)
    except TargetRaised as e:   # it may have the failure; the doctor cannot shift it there
        return inconclusive(f"the target raised on positions {LONG_OFFSET}.. ({e.error})", "unreachable",
                            through_cache=True, error=e.error)
    if not s0 or not s1:
        raise ctx.unseen("positions move its KV cache: the check compares the attention scores, and no call's "
                         "scores were seen")
    # keys a new query sees that changed with the shift (a read of another length: all its entries)
    moved = sum(int((va != vb).sum()) if va.shape == vb.shape else max(va.numel(), vb.numel())
                for (_, va), (_, vb) in zip(s1, s0))
    if moved:   # which new keys a new query sees changed with the shift: nothing else to compare
        parts = [f"the first attention call: at +{LONG_OFFSET} the new tokens' mask among themselves differs from "
                 f"+0's in {moved} entries (a causal mask not aligned to the cache's end?)"]
        return with_bfloat16(ctx, a, lambda lo, o, auto: new_scores(ctx, lo, x, o, auto), _rel, "scores' ", True,
                             math.inf, "shift_moves_mask", parts, through_cache=True, absolute_positions=False,
                             shift_16=None, shift=math.inf, per_query_residual=None)
    d = _rel(s1, s0)
    parts, bad, measured, cause, r = [f"the first attention call: the new tokens' scores among themselves at "
                                      f"+{LONG_OFFSET} against +0: {d:.3g}"], False, d, "", None
    try:
        d_small = _rel(new_scores(ctx, a, x, 16), s0) if d > LONG_REL else 0.0
    except TargetRaised as e:   # as at +4096: the doctor cannot shift it there
        return inconclusive(f"the target raised on positions 16.. ({e.error})", "unreachable",
                            through_cache=True, error=e.error)
    if d_small > ABSOLUTE_POS:   # absolute positions (learned, sinusoidal) move them by design: as without a cache
        parts.append(f"but at +16 they already differ by {d_small:.3g}: absolute positions, no shift invariance "
                     "to test")
        return with_bfloat16(ctx, a, lambda lo, o, auto: new_scores(ctx, lo, x, o, auto), _rel, "scores' ", False,
                             0.0, "", parts, through_cache=True, absolute_positions=True, shift_16=d_small,
                             shift=d, per_query_residual=None)
    if d > LONG_REL:
        r = _per_query(s1, s0)
        measured = r
        if r <= LONG_REL:
            parts.append(f"but they are those at +0 times one factor per query (residual {r:.3g}): a "
                         "position-dependent temperature, not a phase error")
        else:
            bad, cause = True, "shift_moves_outputs"
            parts.append(f"not those at +0 times a factor per query (residual {r:.3g})")
    return with_bfloat16(ctx, a, lambda lo, o, auto: new_scores(ctx, lo, x, o, auto), _rel, "scores' ", bad,
                         measured, cause, parts, through_cache=True, absolute_positions=False,
                         shift_16=d_small or None, shift=d, per_query_residual=r)


# the references bfloat16 is measured against, best first: float32 where the target does not run in
# float64 (grouped_mm of MoE experts has no float64 kernel); its rounding (~1e-7) is far below
# bfloat16's (~4e-3)
REFERENCES = (torch.float64, torch.float32)


def _cast(a, dt):
    try:
        return a.converted(dtype=dt)
    except (RuntimeError, TypeError) as e:   # a module torch cannot cast: the half cannot run
        raise NotPerformed(f"the target cannot be cast to {str(dt).replace('torch.', '')} "
                           f"({type(e).__name__}: {str(e)[:80]})") from e


# the bfloat16 error is judged over several starts: its smallest near +4096 against its largest near +0
# (the noise: positions below 256, which bfloat16 holds exactly, no phase rounded there). A phase that
# loses precision with the position raises the error at every long start; a mixture of experts' router
# whose top-1 choice flips under bfloat16 rounding moves a token's whole output at some starts of
# either side (measured on transformers' MoE models at random init: 0.007 without a flip, 0.03-0.08
# with one, at starts from +0 to +4096 alike; Aria's text model at three of five long starts, so a
# median still read flips: the smallest is what every long start shares).
SPREAD = (0, 48, 96, 144, 192)


def starts(T: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the short starts, the long ones): +0 and the starts of SPREAD whose T positions stay below
    256; LONG_OFFSET and as many starts below it."""
    short = tuple(o for o in SPREAD if o == 0 or o + T <= 256)
    return short, tuple(LONG_OFFSET - o for o in reversed(short))


def _reference(a, at, offsets=(0, LONG_OFFSET), err=None) -> tuple[str, dict, list[str]]:
    """(dtype name, {offset: at(a copy in that dtype, offset, False)}, why each earlier one that ran
    was passed over) of the first of REFERENCES the target runs in and whose outputs err can compare
    against (err(ref, ref) does not raise NotPerformed: they are finite); where none can, the last
    one's TargetRaised or NotPerformed."""
    passed = []
    for i, dt in enumerate(REFERENCES):
        hi = _cast(a, dt)
        name = str(dt).replace("torch.", "")
        try:
            ref = {o: at(hi, o, False) for o in offsets}
            if err is not None:
                for r in ref.values():
                    err(r, r)
            return name, ref, passed
        except (TargetRaised, NotPerformed) as e:   # a kernel without this dtype, or not finite in it: the next one
            if i == len(REFERENCES) - 1:
                raise
            if isinstance(e, NotPerformed):
                passed.append(f"{name}'s {e.why}"[:160])


def bfloat16_half(ctx, a, at, err, what, parts) -> tuple[list[dict], str, str | None]:
    """long_positions' bfloat16 half: in bfloat16 (weights cast, and float32 weights under
    autocast, as mixed-precision training runs) the error against float64 (float32 where the
    target does not run in float64), its smallest over the long starts near +4096, must stay near
    the noise, its largest over the short starts near +0 (starts()). at(adapter, offset, autocast): what is
    compared (the outputs, or the scores among the new tokens); err(got, the reference's).
    A mode that raises where the reference ran the same positions is the target's failure
    (raised_in_low_precision, as low_precision reads it), recorded with `raised` and no errors;
    autocast raising on a write into the target's own state (state_write_raised) is not run.
    Returns ([{mode, reference, error_0, error_4096, noise, long, limit}], its cause ("" if it
    held), why it could not run (None: it ran)); appends its words to parts."""
    records, cause, not_run = [], "", None
    short, long = starts(ctx.T)
    try:
        ref_name, ref, passed = _reference(a, at, short + long, err)
        if passed:
            parts.append(f"bfloat16 against {ref_name} ({'; '.join(passed)})")
        lo = _cast(a, torch.bfloat16)
        for mode, low, auto in (("weights", lo, False), ("autocast", a, True)):
            try:
                e = {o: err(at(low, o, auto), ref[o]) for o in short + long}
            except TargetRaised as ex:   # the reference ran these positions: raising in bfloat16 is the target's
                limit = auto and state_write_raised(low.module, lambda: [at(low, o, auto) for o in short + long])
                if limit:   # its state's dtype is fixed at set-up: autocast cannot look, its weights run can
                    parts.append(f"bfloat16 {mode}: not run ({limit})")
                    not_run = not_run or limit
                    continue
                records.append({"mode": mode, "reference": ref_name, "error_0": None, "error_4096": None,
                                "noise": None, "long": None, "limit": None, "raised": ex.error})
                cause = cause or "raised_in_low_precision"
                parts.append(f"bfloat16 {mode}: raised {ex.error} (the {ref_name} reference ran the same positions)")
                continue
            es, el = _largest([e[o] for o in short]), _smallest([e[o] for o in long])
            lim = LONG_BF16_RATIO * es + LONG_BF16_FLOOR
            records.append({"mode": mode, "reference": ref_name, "error_0": e[0], "error_4096": e[LONG_OFFSET],
                            "noise": es, "long": el, "limit": lim})
            if not all(math.isfinite(v) for v in e.values()):
                cause = cause or "bfloat16_nonfinite"
            elif el > lim:
                cause = cause or "bfloat16_error_grows"
            parts.append(f"bfloat16 {mode}: {what}error against {ref_name} at +0 {e[0]:.3g}, at +{LONG_OFFSET} "
                         f"{e[LONG_OFFSET]:.3g}; at most {es:.3g} over +{short[0]}..+{short[-1]}, smallest "
                         f"over +{long[0]}..+{long[-1]} {el:.3g} (limit {lim:.3g})")
        return records, cause, not_run
    except (Unsupported, TargetRaised, NotPerformed) as ex:   # the target cannot run in this precision
        why = ex.why if not isinstance(ex, TargetRaised) else f"the target raised: {ex.error}"
        parts.append(f"bfloat16: not run ({why})")
        return records, cause, why


def _largest(v: list[float]) -> float:
    """The largest value (NaN where any is: never read as small)."""
    return max(v) if all(math.isfinite(x) for x in v) else math.nan


def _smallest(v: list[float]) -> float:
    """The smallest value (NaN where any is: never read as small)."""
    return min(v) if all(math.isfinite(x) for x in v) else math.nan


def with_bfloat16(ctx, a, at, err, what, bad, measured, cause, parts, **measurements):
    """long_positions' row: what the shift found, then the bfloat16 half (bfloat16_half). What ran
    held but the bfloat16 half could not run: inconclusive, never a pass."""
    records, bcause, not_run = bfloat16_half(ctx, a, at, err, what, parts)
    if bcause:
        bad, cause = True, cause or bcause
        measured = max(measured, max(math.inf if r.get("raised") else max(r["error_0"], r["error_4096"])
                                     for r in records))
    tol = f"<= {LONG_REL:g}; bf16 <= {LONG_BF16_RATIO:g}x + {LONG_BF16_FLOOR:g}"
    r = judged(bad, measured, tol, "; ".join(parts), cause, **measurements, bfloat16=records)
    return held_in_part(r, {"the bfloat16 half": not_run} if not_run else {})
