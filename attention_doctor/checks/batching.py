"""Batch independence, padding (right and left), and rows with no visible key."""
import math

import torch

from attention_doctor.checks.causality import _GradientHalf, refused_autograd
from attention_doctor.checks.common import AGREE_REL, held_in_part, inconclusive, judged, rel, row
from attention_doctor.result import FAIL, PASS, WARN
from attention_doctor.signals import NotPerformed, TargetRaised, Unreachable, Unsupported


def batch_independence(ctx):
    ctx.require_repeatable()
    agree = ctx.limit(AGREE_REL)   # the target's own rounding noise, where it keeps some
    B = ctx.T  # B == T: an unexpanded (B, T) mask broadcasts silently onto the queries
    x = ctx.sample(B=B, k=3)
    d_plain = rel(ctx.run(x)[0], ctx.run(x[:1])[0], "row 0 alone")
    mask = torch.ones(B, ctx.T, dtype=torch.bool, device=ctx.adapter.device)
    for b in range(1, B):  # every other row right-padded, by a different amount
        mask[b, ctx.T - 1 - (b % (ctx.T - 1)):] = False
    d_mask, not_run, na_part = None, {}, False
    try:
        d_mask = rel(ctx.run(x, mask)[0], ctx.run(x[:1], mask[:1])[0], "row 0 alone")
        masked = f"; with the other rows padded: {d_mask:.3g}"
    except Unreachable as e:
        not_run["the padded half"] = e.why
        masked = f"; with padding: not run ({e.why})"
    except Unsupported as e:
        na_part, masked = True, f"; with padding: n/a ({e.why})"
    worst = max(d_plain, d_mask or 0.0)
    r = judged(worst > agree, worst, f"<= {agree:g}",
               f"row 0 in a batch of {B} (B == T) against alone: {d_plain:.3g}{masked}",
               "rows_mix" if d_plain > agree else "padding_mask_broadcast",
               limit=agree, batch=B, plain=d_plain, padded=d_mask)
    if na_part:
        r.measurements["not_applicable"] = ["padded"]
    return held_in_part(one_row_mask_warned(ctx, r), not_run)


def one_row_mask_warned(ctx, r):
    """A pass that held with a mask encoding found on a batch, where an encoding tried first masks
    one row only (conventions.py: an unexpanded (B, T) mask that broadcasts at B = 1): a warn, since
    a caller who passes that shape gets rows mixed or an error."""
    one_row = getattr(ctx.adapter, "mask_one_row", None)
    if r.outcome is not PASS or one_row is None:
        return r
    r.outcome, r.cause = WARN, "mask_shape_batch_only"
    r.detail += (f"; held with its mask as {ctx.adapter.mask_encoding}: as {one_row} (what one row takes) it masks "
                 "no batch of two")
    r.measurements["one_row_encoding"] = one_row
    return r


def padding(ctx):
    try:   # the mask's interface first: a target that takes none is n/a (Unsupported), noise or not
        ctx.run(*ctx.left_padded(k=4))
    except (TargetRaised, Unreachable):
        pass   # what these mean is said by the runs below
    ctx.require_repeatable()
    agree = ctx.limit(AGREE_REL)   # the target's own rounding noise, where it keeps some
    P, T = ctx.T // 4, ctx.T
    L = T - P
    real = ctx.sample(1, L, k=4)
    other = ctx.sample(2, T, k=5)
    ref = ctx.run(real)[0]
    what = "the unpadded row's outputs"
    # right: row 0 = real tokens then P padding tokens; row 1 unpadded (a mask the target lacks: n/a)
    x = other.clone()
    x[0, :L] = real[0]
    m = torch.ones(2, T, dtype=torch.bool, device=x.device)
    m[0, L:] = False
    d_right = rel(ctx.run(x, m)[0, :L], ref, what)
    # left: row 0 = P padding tokens then the real tokens
    x = other.clone()
    x[0, P:] = real[0]
    m = torch.ones(2, T, dtype=torch.bool, device=x.device)
    m[0, :P] = False
    d_left = rel(ctx.run(x, m)[0, P:], ref, what)
    pos = (m.long().cumsum(-1) - 1).clamp(min=0)
    d_left_pos, positions_not_run = None, None
    if ctx.adapter.kind == "lm":
        try:
            d_left_pos = rel(ctx.run(x, m, positions=pos)[0, P:], ref, what)
        except Unreachable as e:
            positions_not_run = e.why
        except Unsupported:   # no position ids by nature: left padding is judged without them
            pass
    tol = f"<= {agree:g}"
    detail = (f"real tokens' outputs against the unpadded row: right padding {d_right:.3g}, left padding "
              f"{d_left:.3g}" + ("" if d_left_pos is None else f", left padding with position ids from the mask {d_left_pos:.3g}"))
    meas = dict(limit=agree, right=d_right, left=d_left, left_with_positions=d_left_pos)
    if getattr(ctx.adapter, "mask_ignored", False) and max(d_right, d_left) > agree:
        # measured when the target was read: no encoding of its mask changed any output
        return row(FAIL, max(d_right, d_left), tol, detail + ". Its forward takes a padding mask and ignores it "
                   "(no encoding tried changes any output)", "mask_ignored", **meas)
    if d_right > agree:   # inf: padding made a real output NaN or inf (a -inf fill's NaN row reaching it)
        return row(FAIL, d_right, tol, detail, "nonfinite_outputs" if d_right == math.inf else "right_padding", **meas)
    if d_left <= agree:
        return one_row_mask_warned(ctx, row(PASS, max(d_right, d_left), tol, detail, **meas))
    if positions_not_run is not None:   # a warn or a fail: which one, only the positions could say
        return inconclusive(f"left padding moves the real tokens' outputs ({d_left:.3g}), and left padding with "
                            f"position ids could not run ({positions_not_run})", "part_not_run", d_left, tol, detail,
                            **meas, not_run=["left_with_positions"])
    if d_left_pos is not None and d_left_pos <= agree:
        return row(WARN, d_left, tol, detail + ". Left padding changes the outputs unless the caller passes position "
                   "ids from the mask: positions count from the padding (huggingface/transformers #21080)",
                   "positions_from_padding", **meas)
    return row(FAIL, d_left, tol, detail, "nonfinite_outputs" if d_left == math.inf else "left_padding", **meas)


def _describe(t: torch.Tensor) -> str:
    """What rows with no visible key return, in a word of fully_masked_rows' `padded_rows`."""
    if t.numel() == 0:
        return "none"
    if torch.isnan(t).any():
        return "NaN"
    if not torch.isfinite(t).all():
        return "infinite"
    return "zeros" if bool((t == 0).all()) else "finite values"


def _param_grads(loss, params):
    """How many parameter gradients of loss are not finite, or a _GradientHalf saying why none
    were taken."""
    if not params:
        return _GradientHalf("no parameter of the target requires grad")
    if not loss.requires_grad:
        return _GradientHalf("the forward computes no gradient (it runs under inference mode or no_grad)", na=True)
    try:
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    except Exception as e:  # noqa: BLE001 -- the target's backward refused (Reformer's reversible layers in eval): the gradient half not run (inconclusive), never a pass
        return _GradientHalf(f"its backward raised in eval mode ({type(e).__name__}: {str(e)[:80]})")
    return sum(int((~torch.isfinite(g)).sum()) for g in grads if g is not None)


def fully_masked_rows(ctx):
    """Rows whose query sees no key: left padding under a causal mask (the padding tokens'
    queries), or, in a bidirectional target, a row that is padding only."""
    a = ctx.adapter
    if getattr(a, "mask_ignored", False):   # no row is ever fully masked: nothing to look at (padding fails)
        raise NotPerformed("the target ignores its padding mask (padding fails): no row has every key masked",
                           "mask_ignored")
    if ctx.require_causal():
        x, mask = ctx.left_padded(k=6)
        layout = "left_padding"
    else:
        x = ctx.sample(2, ctx.T, k=6)
        mask = torch.ones(2, ctx.T, dtype=torch.bool, device=a.device)
        mask[0] = False
        layout = "padding_only_row"
    with torch.enable_grad():
        if a.kind == "layer":
            x = x.clone().requires_grad_(True)
        y = ctx.run(x, mask, grad=True)
        w = torch.randn(y.shape, generator=ctx.gen(8)).to(y.device, y.dtype)
        loss = (y * w)[mask].sum()   # the padded positions' outputs are not in the loss
        grads = (_GradientHalf(refused_autograd(ctx)) if ctx.description.autograd_refused
                 else _param_grads(loss, [p for p in a.module.parameters() if p.requires_grad]))
    with torch.no_grad():   # inference may take another path (nn.MultiheadAttention's fast path)
        padded_ng = _describe(ctx.run(x.detach(), mask)[~mask])
    bad_out = int((~torch.isfinite(y[mask])).sum())
    bad_grad = None if isinstance(grads, _GradientHalf) else grads
    padded = _describe(y.detach()[~mask])
    r = judged(bool(bad_out or bad_grad), bad_out + (bad_grad or 0), "== 0 non-finite",
               f"{bad_out} non-finite real outputs, " +
               (f"{bad_grad} non-finite parameter gradients (loss on the real positions only)" if bad_grad is not None
                else f"parameter gradients {'n/a' if grads.na else 'not run'} ({grads.why})") +
               f"; rows with no visible key return {padded} (under no_grad: {padded_ng})",
               "nonfinite_outputs" if bad_out else "nonfinite_gradients", layout=layout, nonfinite_outputs=bad_out,
               nonfinite_gradients=bad_grad, padded_rows=padded, padded_rows_no_grad=padded_ng)
    if isinstance(grads, _GradientHalf) and grads.na:
        r.measurements["not_applicable"] = ["gradient"]
        return r
    return held_in_part(r, {"the gradient half": grads.why} if isinstance(grads, _GradientHalf) else {})
