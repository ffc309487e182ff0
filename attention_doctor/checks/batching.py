"""Batch independence, padding (right and left), and rows with no visible key."""
import math

import torch

from attention_doctor.adapters import Unsupported
from attention_doctor.checks.common import AGREE_REL, not_repeatable, rel, row, unsupported
from attention_doctor.checks.record import Check


def batch_independence(ctx):
    if ctx.deterministic is False:
        return not_repeatable("batch_independence")
    B = ctx.T  # B == T: an unexpanded (B, T) mask broadcasts silently onto the queries
    x = ctx.sample(B=B, k=3)
    d_plain = rel(ctx.run(x)[0], ctx.run(x[:1])[0])
    mask = torch.ones(B, ctx.T, dtype=torch.bool, device=ctx.adapter.device)
    for b in range(1, B):  # every other row right-padded, by a different amount
        mask[b, ctx.T - 1 - (b % (ctx.T - 1)):] = False
    try:
        d_mask = rel(ctx.run(x, mask)[0], ctx.run(x[:1], mask[:1])[0])
        masked = f"; with the other rows padded: {d_mask:.3g}"
    except Unsupported as e:
        d_mask, masked = 0.0, f"; with padding: n/a ({e})"
    worst = max(d_plain, d_mask)
    cause = "" if worst <= AGREE_REL else "rows_mix" if d_plain > AGREE_REL else "padding_mask_broadcast"
    return row("batch_independence", "fail" if worst > AGREE_REL else "pass", worst, f"<= {AGREE_REL:g}",
               f"row 0 in a batch of {B} (B == T) against alone: {d_plain:.3g}{masked}", cause)


def padding(ctx):
    if ctx.deterministic is False:
        return not_repeatable("padding")
    P, T = ctx.T // 4, ctx.T
    L = T - P
    real = ctx.sample(1, L, k=4)
    other = ctx.sample(2, T, k=5)
    try:
        ref = ctx.run(real)[0]
        # right: row 0 = real tokens then P padding tokens; row 1 unpadded
        x = other.clone()
        x[0, :L] = real[0]
        m = torch.ones(2, T, dtype=torch.bool, device=x.device)
        m[0, L:] = False
        d_right = rel(ctx.run(x, m)[0, :L], ref)
        # left: row 0 = P padding tokens then the real tokens
        x = other.clone()
        x[0, P:] = real[0]
        m = torch.ones(2, T, dtype=torch.bool, device=x.device)
        m[0, :P] = False
        d_left = rel(ctx.run(x, m)[0, P:], ref)
    except Unsupported as e:
        return unsupported("padding", e)
    pos = (m.long().cumsum(-1) - 1).clamp(min=0)
    try:
        d_left_pos = rel(ctx.run(x, m, positions=pos)[0, P:], ref) if ctx.adapter.kind == "lm" else None
    except Unsupported:
        d_left_pos = None
    tol = f"<= {AGREE_REL:g}"
    detail = (f"real tokens' outputs against the unpadded row: right padding {d_right:.3g}, left padding "
              f"{d_left:.3g}" + ("" if d_left_pos is None else f", left padding with position ids from the mask {d_left_pos:.3g}"))
    if d_right > AGREE_REL:
        return row("padding", "fail", d_right, tol, detail, "right_padding")
    if d_left <= AGREE_REL:
        return row("padding", "pass", max(d_right, d_left), tol, detail)
    if d_left_pos is not None and d_left_pos <= AGREE_REL:
        return row("padding", "warn", d_left, tol, detail + ". Left padding changes the outputs unless the "
                   "caller passes position ids from the mask: positions count from the padding "
                   "(huggingface/transformers #21080)", "positions_from_padding")
    return row("padding", "fail", d_left, tol, detail, "left_padding")


def _describe(t: torch.Tensor) -> str:
    if t.numel() == 0:
        return "none"
    if torch.isnan(t).any():
        return "NaN"
    if not torch.isfinite(t).all():
        return "inf"
    return "zeros" if bool((t == 0).all()) else "finite values"


def fully_masked_rows(ctx):
    """Rows whose query sees no key: left padding under a causal mask (the padding tokens'
    queries), or, in a bidirectional layer, a row that is padding only."""
    a = ctx.adapter
    if ctx.causal is False:
        x = ctx.sample(2, ctx.T, k=6)
        mask = torch.ones(2, ctx.T, dtype=torch.bool, device=a.device)
        mask[0] = False
    else:
        x, mask = ctx.left_padded(k=6)
    try:
        with torch.enable_grad():
            if a.kind == "layer":
                x = x.clone().requires_grad_(True)
            y = ctx.run(x, mask, grad=True)
            w = torch.randn(y.shape, generator=ctx.gen(8)).to(y.device, y.dtype)
            loss = (y * w)[mask].sum()   # the padded positions' outputs are not in the loss
            params = [p for p in a.module.parameters() if p.requires_grad]
            try:
                grads, no_grad = torch.autograd.grad(loss, params, allow_unused=True), None
            except Exception as e:   # a backward the target refuses in eval mode (Reformer's reversible layers)
                grads, no_grad = [], f"{type(e).__name__}: {str(e)[:80]}"
    except Unsupported as e:
        return unsupported("fully_masked_rows", e)
    with torch.no_grad():   # inference may take another path (nn.MultiheadAttention's fast path)
        padded_ng = _describe(ctx.run(x.detach(), mask)[~mask])
    bad_out = int((~torch.isfinite(y[mask])).sum())
    bad_grad = sum(int((~torch.isfinite(g)).sum()) for g in grads if g is not None)
    padded = _describe(y.detach()[~mask])
    verdict = "fail" if bad_out or bad_grad else "pass"
    cause = "nonfinite_outputs" if bad_out else "nonfinite_gradients" if bad_grad else ""
    return row("fully_masked_rows", verdict, bad_out + bad_grad, "== 0 non-finite",
               f"{bad_out} non-finite real outputs, " +
               (f"{bad_grad} non-finite parameter gradients (loss on the real positions only)" if no_grad is None
                else f"parameter gradients n/a (its backward raised in eval mode: {no_grad})") +
               f"; rows with no visible key return {padded} "
               f"(under no_grad: {padded_ng})", cause)


CHECKS = (
    Check(batch_independence, does="row 0 alone against row 0 in a batch of B = T = 16 rows, unpadded and with the "
                                   "others padded",
          fails_when="row 0 changes",
          tolerance="1e-5: the same sums; B == T because an unexpanded (B, T) mask broadcasts onto the queries "
                    "exactly then",
          applies="every target (the padded half where it takes a padding mask)",
          thread="hyunwoongko/transformer #40", targets=("mask_broadcast",),
          causes={"rows_mix": "row 0 changes with the other rows, unpadded",
                  "padding_mask_broadcast": "row 0 changes only when the others are padded (a (B, T) mask broadcast "
                                            "onto the queries)"}),
    Check(padding, does="real tokens right-padded and left-padded against the unpadded row (padded positions "
                        "hold the model's pad token where it has one: RoBERTa counts positions by it); left "
                        "padding again with position ids from the mask",
          fails_when="right or left padding moves the real tokens' outputs",
          tolerance="1e-5; left padding that passes only with position ids from the mask is a `warn` "
                    "(positions count from the padding unless the caller gives them)",
          applies="targets that take a padding mask", thread="huggingface/transformers #21080",
          targets=("left_padding_positions", "mask_broadcast_shape_error"),
          causes={"right_padding": "right padding moves the real tokens' outputs",
                  "left_padding": "left padding moves them, with position ids from the mask too",
                  "positions_from_padding": "warn: left padding moves them unless the caller passes position "
                                            "ids from the mask"}),
    Check(fully_masked_rows, does="left padding under a causal mask (rows with no visible key), backward from the "
                                  "real positions",
          fails_when="a real output or any parameter gradient is not finite",
          tolerance="0 non-finite; what the padded rows return is reported, with autograd and under no_grad",
          applies="targets that take a padding mask", thread="pytorch/pytorch #41508",
          targets=("fully_masked_rows",),
          causes={"nonfinite_outputs": "a real token's output is NaN or inf (a -inf fill's NaN row reaching it)",
                  "nonfinite_gradients": "outputs finite, parameter gradients not (0 * NaN in the backward)"}),
)
