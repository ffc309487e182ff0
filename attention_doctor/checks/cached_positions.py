"""long_positions where positions are a KV cache's write offset (Meta's Llama `start_pos`, LitGPT's
`input_pos`): at +4096 the new tokens' queries also read the cache's 4096 empty slots, so their
outputs cannot be compared with those at +0. Their scores among themselves can: each new query
against the new keys, at the same relative offsets at +0 and at +4096, rows centred (a constant
per row, a softmax's maximum taken off, does not change the weights). The first attention call
only: the empty slots change its outputs, hence every later layer's q and k."""
from contextlib import nullcontext

import torch

from attention_doctor.adapters import Unsupported
from attention_doctor.checks.common import (LONG_BF16_FLOOR, LONG_BF16_RATIO, LONG_OFFSET, LONG_REL, TargetRaised,
                                            inconclusive, row, unseen, unsupported)
from attention_doctor.checks.scale import unit_qk


def new_scores(ctx, adapter, x, offset, autocast=False) -> list[torch.Tensor]:
    """The first attention call's scores of the T new queries against the T new keys (float64,
    NaN where masked, rows centred), at positions offset.., q and k unit-variance; [] if none."""
    T = x.shape[1]
    pos = torch.arange(offset, offset + T, device=adapter.device).expand(x.shape[0], -1)
    cast = torch.autocast(adapter.device.type, dtype=torch.bfloat16) if autocast else nullcontext()
    with unit_qk(ctx, adapter), cast:
        _, calls = ctx.probe(x, positions=pos, adapter=adapter)
    out = []
    for c in calls:
        if (c.scores is None and not c.complete) or c.q is None or c.q.shape[-2] != T:
            continue
        full = c.seen_scores().double()
        # the new keys: at the offset in a cache of fixed length (LitGPT), else the last T (Meta's)
        cols = slice(offset, offset + T) if full.shape[-1] >= offset + T and full.shape[-1] > T else slice(-T, None)
        s = full[..., cols]
        vis = torch.isfinite(s) if c.visible is None else c.visible.expand(full.shape)[..., cols] & torch.isfinite(s)
        s = s.masked_fill(~vis, float("nan"))
        return [s - s.nanmean(-1, keepdim=True)]
    return []


def _rel(a: list, b: list) -> float:
    """The largest |a - b| over the calls, relative to the largest |b| (masked entries left out)."""
    num = max(float((x - y).abs().nan_to_num(0.0).max()) for x, y in zip(a, b))
    return num / max(max(float(y.abs().nan_to_num(0.0).max()) for y in b), 1e-30)


def _per_query(a: list, b: list) -> float:
    """The residual of a fitted as b times one factor per query (a temperature by position)."""
    worst = 0.0
    for x, y in zip(a, b):
        x, y = x.nan_to_num(0.0), y.nan_to_num(0.0)
        f = (x * y).sum(-1, keepdim=True) / (y * y).sum(-1, keepdim=True).clamp_min(1e-300)
        worst = max(worst, float((x - f * y).abs().max()) / max(float(y.abs().max()), 1e-30))
    return worst


def long_positions_through_cache(ctx, a, x):
    try:
        s0 = new_scores(ctx, a, x, 0)
        s1 = new_scores(ctx, a, x, LONG_OFFSET)
    except Unsupported as e:
        return unsupported("long_positions", e)
    except TargetRaised as e:   # it may have the failure; the doctor cannot shift it there
        return inconclusive("long_positions", f"the target raised on positions {LONG_OFFSET}.. ({e})", "unreachable")
    if not s0 or not s1:
        return unseen("long_positions", "positions move its KV cache: the check compares the attention scores, "
                      "and no call's scores were seen")
    d = _rel(s1, s0)
    parts, bad, measured, cause = [f"the first attention call: the new tokens' scores among themselves at "
                                   f"+{LONG_OFFSET} against +0: {d:.3g}"], False, d, ""
    if d > LONG_REL:
        r = _per_query(s1, s0)
        measured = r
        if r <= LONG_REL:
            parts.append(f"but they are those at +0 times one factor per query (residual {r:.3g}): a "
                         "position-dependent temperature, not a phase error")
        else:
            bad, cause = True, "shift_moves_outputs"
            parts.append(f"not those at +0 times a factor per query (residual {r:.3g})")
    return bfloat16_half(a, lambda lo, o, auto: new_scores(ctx, lo, x, o, auto), _rel, "scores' ", bad, measured,
                         cause, parts)


# the references bfloat16 is measured against, best first: float32 where a kernel has no float64
# (grouped_mm of MoE experts); its rounding (~1e-7) is far below bfloat16's (~4e-3)
REFERENCES = (torch.float64, torch.float32)


def _reference(a, at):
    """(dtype name, {offset: at(copy in that dtype)}) of the first of REFERENCES the target runs
    in; the error of the last that raised when none does."""
    for i, dt in enumerate(REFERENCES):
        try:
            hi = a.converted(dtype=dt)
            return str(dt).replace("torch.", ""), {o: at(hi, o, False) for o in (0, LONG_OFFSET)}
        except (TargetRaised, RuntimeError, TypeError):   # a kernel without this dtype: the next reference
            if i == len(REFERENCES) - 1:
                raise


def bfloat16_half(a, at, err, what, bad, measured, cause, parts):
    """long_positions' bfloat16 half and its row: in bfloat16 (weights cast, and float32 weights
    under autocast, as mixed-precision training runs) the error against float64 (float32 where
    the target does not run in float64) at +4096 must stay near that at +0. at(adapter, offset,
    autocast): what is compared (the outputs, or the scores among the new tokens); err(got, the
    reference's). What ran held but this half could not run: inconclusive, never a pass."""
    try:
        ref_name, ref = _reference(a, at)
        for label, lo, auto in (("bfloat16 weights", a.converted(dtype=torch.bfloat16), False),
                                ("bfloat16 autocast", a, True)):
            e = [err(at(lo, o, auto), ref[o]) for o in (0, LONG_OFFSET)]
            lim = LONG_BF16_RATIO * e[0] + LONG_BF16_FLOOR
            if e[1] > lim:
                bad, measured, cause = True, max(measured, e[1]), cause or "bfloat16_error_grows"
            parts.append(f"{label}: {what}error against {ref_name} at +0 {e[0]:.3g}, at +{LONG_OFFSET} {e[1]:.3g} "
                         f"(limit {lim:.3g})")
        half = None
    except (Unsupported, TargetRaised, RuntimeError, TypeError) as ex:
        half = f"{type(ex).__name__}: {str(ex)[:80]}"
        parts.append(f"bfloat16: not run ({half})")
    tol = f"<= {LONG_REL:g}; bf16 <= {LONG_BF16_RATIO:g}x + {LONG_BF16_FLOOR:g}"
    if half and not bad:   # the bfloat16 half could not run: what ran held, and that is not a pass
        return inconclusive("long_positions", f"its bfloat16 half could not run ({half})", "part_not_run",
                            measured, tol, "; ".join(parts))
    return row("long_positions", "fail" if bad else "pass", measured, tol, "; ".join(parts), cause)
