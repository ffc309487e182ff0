"""bidirectional_prefix: a target whose mask reads token types (a prefix, or an image, seen both
ways: PaliGemma's prefix, Gemma3's image tokens), run as in training (train mode, labels on the
suffix). Which type makes a leading run seen both ways is measured (the first outputs move with the
run's last token); then the row left-padded, the pads holding two different fillings and either
type: the real tokens' outputs must not move with what the pads hold (the padding mask applied
after the prefix is unmasked), and the suffix must stay causal (no output moves with the last
token)."""
import torch

from attention_doctor.checks.common import AGREE_REL, EXACT_REL, inconclusive, judged, na, rel
from attention_doctor.signals import NotPerformed, Unsupported

PREFIX, PADS = 6, 4
IGNORE = -100   # the label of a token the loss skips (transformers' and PyTorch's cross-entropy default)


def _training(ctx, x, types, mask=None):
    """The outputs of a training call: train mode, labels on the suffix (pads and prefix IGNORE)."""
    a = ctx.adapter
    labels = torch.where(types == types[:, -1:], x, torch.full_like(x, IGNORE))
    if mask is None:   # a processor's batch: every token real (some releases' training masks need one)
        mask = torch.ones_like(x, dtype=torch.bool)
    labels = labels.masked_fill(~mask, IGNORE)
    with torch.no_grad():
        return ctx.call(a.typed_forward, x, types, mask, labels)


def _last_moves(ctx, x, types, mask=None) -> float:
    """The outputs before the last token: relative change with it replaced (a training call)."""
    x2 = x.clone()
    x2[:, -1] = ctx.sample(1, x.shape[1], k=96)[:, -1]
    return rel(_training(ctx, x2, types, mask)[:, :-1], _training(ctx, x, types, mask)[:, :-1],
               "the outputs before the last token")


def _prefix_type(ctx, x) -> tuple[list[int], dict, dict]:
    """The types v for which a row of v alone is seen both ways (the first outputs move with a later
    token) while a leading run of v before a run of the other type leaves the rest causal (no output
    moves with the row's last token): a prefix LM's prefix type; and per type how far each moved."""
    moved, after = {}, {}
    x2 = x.clone()
    x2[:, PREFIX - 1] = ctx.sample(1, ctx.T, k=97)[:, PREFIX - 1]
    for v in (0, 1):
        alone = torch.full_like(x, v)   # a row of one type: no other run through which a later token could reach
        moved[v] = rel(_training(ctx, x2, alone)[:, :PREFIX - 1], _training(ctx, x, alone)[:, :PREFIX - 1],
                       "the run's outputs")
        types = torch.full_like(x, 1 - v)
        types[:, :PREFIX] = v
        after[v] = _last_moves(ctx, x, types)
    return [v for v in (0, 1) if moved[v] > EXACT_REL and after[v] <= EXACT_REL], moved, after


def bidirectional_prefix(ctx):
    a = ctx.adapter
    if not callable(getattr(a, "typed_forward", None)):
        return na("takes no token types (an Adapter's typed_forward enables it)", "no_token_types")
    a.module.train()   # as in training (examine puts the copy back after each check)
    x = ctx.sample(1, ctx.T, k=95)
    try:
        types = torch.zeros_like(x)
        again = rel(_training(ctx, x, types), _training(ctx, x, types), "the first training call")
    except Unsupported as e:   # no token_type_ids, or types whose meaning the config does not declare
        return na(f"token types: {e.why}", "no_token_types")
    if again > EXACT_REL:
        raise NotPerformed(f"two training calls differ by {again:.3g} (dropout in train mode): no comparison holds",
                           "not_repeatable")
    found, moved, after = _prefix_type(ctx, x)
    if len(found) != 1:
        if any(d > EXACT_REL for d in moved.values()):
            return inconclusive("in training a leading run is seen both ways, but not as one prefix type before a "
                                f"causal rest (per type: run moved {moved}, the rest {after})", "prefix_ambiguous")
        return na("in training, token types given and no pixels, neither type's leading run is seen both ways: "
                  "its mask does not read token types alone (a prefix made only with an image's pixels, as "
                  "PaliGemma's before 4.45, is out of the doctor's reach)", "no_prefix")
    p = found[0]
    agree = ctx.limit(AGREE_REL)
    types = torch.full_like(x, 1 - p)
    types[:, :PREFIX] = p
    real = torch.ones(1, PADS + ctx.T, dtype=torch.bool, device=x.device)
    real[:, :PADS] = False
    pads = {}
    for pad_type in (p, 1 - p):   # a padded row the target raises on fails (target_raised): a valid batch
        ptypes = torch.cat([torch.full_like(types[:, :PADS], pad_type), types], 1)
        outs = [_training(ctx, torch.cat([ctx.sample(1, PADS, k=k), x], 1), ptypes, real)[:, PADS:] for k in (98, 99)]
        pads[f"pads_type_{pad_type}"] = rel(outs[1], outs[0], "the padded row's real tokens")
    ptypes = torch.cat([torch.full_like(types[:, :PADS], p), types], 1)
    causal = _last_moves(ctx, torch.cat([ctx.sample(1, PADS, k=98), x], 1), ptypes, real)
    worst_pads = max(pads.values(), default=0.0)
    detail = (f"prefix type {p} (its leading run seen both ways: moved {moved[p]:.3g}); left-padded by {PADS}, "
              "what the pads hold moves the real tokens' outputs by "
              + ", ".join(f"{v:.3g} ({k})" for k, v in pads.items())
              + f"; in the padded row the last token moves the outputs before it by {causal:.3g}")
    cause = "pads_seen" if worst_pads > agree else "suffix_not_causal"
    return judged(worst_pads > agree or causal > EXACT_REL, max(worst_pads, causal), f"<= {agree:g}", detail, cause,
                  prefix_type=p, moved=moved, pads=pads, suffix_leak=causal, limit=agree)
