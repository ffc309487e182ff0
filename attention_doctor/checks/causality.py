"""The target's description (repeatable eval outputs, causal or not: decided before the checks run),
dropout off in eval, the future leak, self-visibility, and the KV cache."""
import math

import torch

from attention_doctor.checks.common import (
    AGREE_REL,
    EXACT_REL,
    NOISE_MARGIN,
    Description,
    applied_mask,
    held_in_part,
    inconclusive,
    judged,
    na,
    rel,
    row,
)
from attention_doctor.result import FAIL, PASS
from attention_doctor.signals import NotPerformed, Signal, TargetRaised, Unreachable, Unsupported, doctor_hook

# -- the description ------------------------------------------------------------------------------

def repeat(y1: torch.Tensor, y2: torch.Tensor) -> tuple[bool, float]:
    """(bit-identical, the largest |y1 - y2|) of two outputs of one input: the same NaN at the same
    places is repeatable, a NaN or an inf on one side only is not (its difference is inf)."""
    n1, n2 = torch.isnan(y1), torch.isnan(y2)
    if y1.shape != y2.shape or not torch.equal(n1, n2):
        return False, math.inf
    a, b = y1[~n1], y2[~n2]
    if torch.equal(a, b):
        return True, 0.0
    fin = torch.isfinite(a) & torch.isfinite(b)
    if not torch.equal(a[~fin], b[~fin]):   # an inf on one side, or of the other sign
        return False, math.inf
    return False, float((a[fin].double() - b[fin].double()).abs().max())


REORDER_ULPS = 64   # reordered sums move outputs by a few ulps of their scale (hf:gpt2 beside load: 9)
DROPOUT_SIZE = 1e-2   # an entry moved by this share of the outputs' scale moved by its own size


def reorder_limit(dtype: torch.dtype) -> float:
    """The largest difference, relative to the outputs' scale, that reordered sums explain:
    REORDER_ULPS ulps of the outputs' dtype (float32: 7.6e-6)."""
    return REORDER_ULPS * torch.finfo(dtype).eps


def moved(y1: torch.Tensor, y2: torch.Tensor) -> dict:
    """How two finite-alike outputs of one input differ, relative to the largest |y1|: `relative`
    (the largest difference), `moved_share` (the share of entries moved by more than DROPOUT_SIZE
    of the scale: dropout's, rounding never), `zeroed_share` (entries exactly 0 in one call only:
    dropout on the outputs themselves)."""
    fin = torch.isfinite(y1) & torch.isfinite(y2)
    a, b = y1[fin].double(), y2[fin].double()
    if a.numel() == 0:
        return {"relative": 0.0, "moved_share": 0.0, "zeroed_share": 0.0}
    d = (a - b).abs() / a.abs().max().clamp_min(1e-30)
    return {"relative": float(d.max()), "moved_share": float((d > DROPOUT_SIZE).double().mean()),
            "zeroed_share": float(((a == 0) != (b == 0)).double().mean())}


def _masks_later_keys(calls) -> bool:
    """Every square attention call whose mask is known hides every key after its query (at least
    one such call): a causal mask, whatever the layer's outputs do with it."""
    seen = 0
    for c in calls:
        if c.visible is None or c.q is None and c.weights is None:
            continue
        w = c.seen_weights()
        if w.shape[-1] != w.shape[-2]:
            continue
        T = w.shape[-1]
        later = torch.ones(T, T, dtype=torch.bool, device=w.device).triu(1)
        if (c.visible.expand_as(w) & later).any():
            return False
        seen += 1
    return seen > 0


def _find_causal(ctx, x, y) -> tuple[bool, str]:
    """A layer that did not say: causal if its attention calls mask every later key (a bug that
    leaks, softmax over the queries, still reads as causal), else if position 0 does not read
    position T-1."""
    if _masks_later_keys(ctx.probe(x)[1]):
        return True, "causal (found: its attention calls mask every later key)"
    ctx.require_repeatable()   # position 0's change would be the noise's
    x2 = x.clone()
    x2[:, -1] = ctx.sample(k=11)[:, -1]
    if rel(ctx.run(x2)[:, 0], y[:, 0], "position 0's output") <= ctx.limit(0.0):   # 0, or within its own noise
        return True, "causal (found: position 0 does not read position T-1)"
    return False, "not causal (found: position 0 reads position T-1, and no attention call masks the later keys)"


def describe(ctx, x, y) -> Description:
    """The target's description from its output y on the plain batch x (ctx.sample()): a second
    call says whether eval outputs repeat; an LM is causal, a layer as its adapter says or as
    found. A part that could not be decided is None, and the signal that kept it so is in
    ctx.undecided (the checks that need it raise it)."""
    a = ctx.adapter
    repeatable = max_diff = None
    rounding = noise = 0.0
    shares = {}
    try:
        y2 = ctx.run(x)
        repeatable, max_diff = repeat(y, y2)
        threads = torch.get_num_threads()
        if not repeatable and math.isfinite(max_diff) and threads > 1:
            # reordered sums across threads, or randomness? One thread removes the first
            torch.set_num_threads(1)   # kept for the checks where it helps; examine() restores it
            y = ctx.run(x)
            y2 = ctx.run(x)
            repeatable, one_thread_diff = repeat(y, y2)
            if repeatable:
                rounding, max_diff = max_diff, 0.0
            else:
                max_diff = max(max_diff, one_thread_diff)
        if not repeatable and math.isfinite(max_diff):
            # still different on the checks' threads: reordering (ulps of the outputs' scale) or
            # randomness (dropout: entries of the outputs' own size), told by the size measured
            shares = moved(y, y2)
            if shares["relative"] <= reorder_limit(a.dtype):
                repeatable, rounding, noise = True, max_diff, shares["relative"]
            else:
                torch.set_num_threads(threads)
    except Signal as s:
        ctx.undecided["repeatable"] = s
    # the repeatability is needed to find causality by the outputs
    nonfinite, values = int((~torch.isfinite(y)).sum()), y.numel()
    refused = ""
    try:   # the checks probe with autograd on, as training runs: a forward that refuses it is forward-only
        ctx.run(x, grad=True)
    except TargetRaised as e:
        refused = e.error[:200]
    except Signal:   # the adapter's own code: the checks that run it say so
        pass
    ctx.description = Description(a.kind, None, "", repeatable, max_diff, nonfinite, values, refused, rounding, noise,
                                  shares)
    if a.kind == "lm":
        causal, how = True, "causal (an LM)"
    elif a.causal is not None:
        causal, how = bool(a.causal), f"{'causal' if a.causal else 'not causal'} (said)"
    else:
        try:
            causal, how = _find_causal(ctx, x, y)
        except Signal as s:
            ctx.undecided["causal"] = s
            causal, how = None, f"undecided ({s.why})"
    return Description(a.kind, causal, how, repeatable, max_diff, nonfinite, values, refused, rounding, noise, shares)


# -- the checks ----------------------------------------------------------------------------------

def finite_output(ctx):
    """The smoke test's own row: the plain forward (float32 or the target's dtype, eval) is finite.
    A forward that is NaN somewhere fails here, whatever the comparisons make of it (they are
    inconclusive where their reference is not finite: NaN is never agreement)."""
    d = ctx.description
    n, total = d.nonfinite, d.values
    if n == 0:
        return row(PASS, 0.0, "0 non-finite values", f"the plain forward's {total} output values are finite",
                   nonfinite=0, values=total)
    return row(FAIL, float(n), "0 non-finite values", f"the plain forward returns {n} of {total} output values NaN "
               "or infinite", "nonfinite_output", nonfinite=n, values=total)


def eval_dropout(ctx):
    d = ctx.description
    if d.repeatable is None:
        raise ctx.undecided["repeatable"]
    limit = reorder_limit(ctx.adapter.dtype)
    tol = f"bit-identical, or within {REORDER_ULPS} ulps of the outputs' scale ({limit:.2g}: reordered sums)"
    shares = dict(d.shares)
    if d.repeatable and d.noise:
        return row(PASS, d.noise, tol, f"two eval calls differ by up to {d.noise:.3g} of the outputs' scale on the checks' "
                   f"thread(s) ({d.noise / torch.finfo(ctx.adapter.dtype).eps:.3g} ulps; "
                   f"{shares['moved_share']:.3g} of the entries moved by over {DROPOUT_SIZE:g} of it): floating-point "
                   "reordering, not randomness; the comparisons' limits are at least "
                   f"{NOISE_MARGIN:g}x it", max_diff=d.rounding, dropout_p=0.0, limit=limit, **shares)
    if d.repeatable and d.rounding:
        return row(PASS, d.rounding, tol, f"two eval calls differ by up to {d.rounding:.3g} on several threads and are "
                   "bit-identical on one (floating-point reordering, not randomness: the checks ran on one thread)",
                   max_diff=d.rounding, dropout_p=0.0, limit=limit)
    if d.repeatable:
        return row(PASS, 0.0, tol, "two eval calls are bit-identical", max_diff=0.0, dropout_p=0.0, limit=limit)
    p = max((c.dropout_p for c in ctx.probe(ctx.sample())[1]), default=0.0)
    why = f"; scaled_dot_product_attention got dropout_p={p:g} in eval" if p else ""
    size = (f" ({shares['relative']:.3g} of the outputs' scale, beyond {limit:.2g}; {shares['moved_share']:.3g} of the "
            f"entries moved by over {DROPOUT_SIZE:g} of it, {shares['zeroed_share']:.3g} zero in one call only)"
            if shares else "")
    return row(FAIL, d.eval_max_diff, tol, f"two eval calls on the same input differ by up to "
               f"{d.eval_max_diff:.3g}{size}{why}", "sdpa_dropout_p" if p else "random_in_eval",
               max_diff=d.eval_max_diff, dropout_p=p, limit=limit, **shares)


def refused_autograd(ctx) -> str:
    return f"its forward refuses autograd ({ctx.description.autograd_refused[:100]}): run forward-only"


class _GradientHalf:
    """Why the gradient half gave no number: `na` (the forward computes no gradient: nothing to
    leak) or not (the doctor could not run it)."""
    def __init__(self, why: str, na: bool = False):
        self.why, self.na = why, na


def _input_grads(ctx, x, t):
    """d (weighted outputs before t) / d (inputs at and after t): (the largest finite |.|, how many
    are not finite, what it was taken against where not the input or the named embedding), or a
    _GradientHalf saying why there is none."""
    a = ctx.adapter
    if ctx.description.autograd_refused:
        return _GradientHalf(refused_autograd(ctx))
    w = torch.randn(x.shape[0], t, 1, generator=ctx.gen(5)).to(a.device)
    if a.kind == "layer":
        xi = x.clone().requires_grad_(True)
        y = ctx.run(xi, grad=True)
        g = _grad((y[:, :t].double() * w).sum(), xi, x.shape, t)
        return g if isinstance(g, _GradientHalf) else (*g, "")
    emb = ctx.call(a.embedding)
    if emb is None:
        return _GradientHalf("no input embedding to differentiate against (an Adapter's embedding() names it)")
    got = []
    h = emb.register_forward_hook(doctor_hook(lambda m, i, o: got.append((o, torch.is_grad_enabled(), i[0] if i else None))))
    try:
        y = ctx.run(x, grad=True)
    finally:
        h.remove()
    via = ""
    if not got:   # the named one never ran (a ModuleList of codebook embeddings): those that ran on the ids
        y, got = _embeddings_on_ids(ctx, a.module, x)
        if not got:
            return _GradientHalf("the input embedding ran 0 times in one forward, and no nn.Embedding ran on the ids")
        via = f"the {len(got)} nn.Embedding call(s) on the ids (the named input embedding did not run)"
    elif len(got) != 1:
        return _GradientHalf(f"the input embedding ran {len(got)} times in one forward")
    if any(isinstance(o, torch.Tensor) and (not on or o.is_inference()) for o, on, _ in got):
        return _GradientHalf("the forward computes no gradient (it runs under inference mode or no_grad)", na=True)
    if not all(isinstance(o, torch.Tensor) and o.requires_grad for o, _, _ in got):
        return _GradientHalf("the input embedding's output is not differentiable here (frozen weights?)")
    # a packed batch (mistral-inference): the embedding fed the ids flattened, row after row
    packed = [isinstance(ids, torch.Tensor) and ids.shape == (x.numel(),) and bool((ids == x.reshape(-1)).all())
              for _, _, ids in got]
    g = _grad((y[:, :t].double() * w).sum(), [o for o, _, _ in got], x.shape, t, packed)
    return g if isinstance(g, _GradientHalf) else (*g, via)


def _fed_by_ids(ids, x) -> bool:
    """ids, an embedding's input, is made of the token ids x: integer, every row of length T (or
    the batch flattened) one of x's rows (MusicGen feeds each codebook's embedding a slice of them)."""
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex() or ids.numel() == 0:
        return False
    T = x.shape[-1]
    if ids.shape[-1] != T and ids.shape != (x.numel(),):
        return False
    rows, mine = ids.reshape(-1, T).long(), x.reshape(-1, T).long()
    return bool((rows[:, None, :] == mine[None, :, :]).all(-1).any(-1).all())


def _embeddings_on_ids(ctx, module, x):
    """(the output, [(out, grad on, ids)] of each nn.Embedding call that ran on the token ids) in one
    forward with autograd on: what the forward embeds the ids with, where the named input embedding
    did not run. Their gradients are taken together (an input's later positions reach the earlier
    outputs through any of them)."""
    calls, hooks = [], []
    rec = doctor_hook(lambda m, i, o: calls.append((o, torch.is_grad_enabled(), i[0] if i else None)))
    for m in module.modules():
        if isinstance(m, torch.nn.Embedding):
            hooks.append(m.register_forward_hook(rec))
    try:
        y = ctx.run(x, grad=True)
    finally:
        for h in hooks:
            h.remove()
    return y, [c for c in calls if _fed_by_ids(c[2], x)]


def _grad(loss, wrt, shape, t, packed=False):
    """(the largest finite |d loss / d wrt| at positions t.., the non-finite count) (wrt (B, T, ...)
    or (T, B, ...): XLNet's embedding is time-major; or a list of such, with a list of `packed`,
    taken together), or a _GradientHalf."""
    many = isinstance(wrt, list)
    wrts, packs = (wrt, packed) if many else ([wrt], [packed])
    try:
        gs = torch.autograd.grad(loss, wrts, allow_unused=True)
    except Exception as e:  # noqa: BLE001 -- the target's backward refused (Reformer's reversible layers in eval): the gradient half not run (inconclusive), never a pass
        return _GradientHalf(f"its backward raised in eval mode ({type(e).__name__}: {str(e)[:80]})")
    worst, nonfinite = 0.0, 0
    for g, p in zip(gs, packs):
        got = _later(g, shape, t, p)
        if isinstance(got, _GradientHalf):
            return got
        worst, nonfinite = max(worst, got[0]), nonfinite + got[1]
    return worst, nonfinite


def _later(g, shape, t, packed):
    """(the largest finite |g| at positions t.., the non-finite count there) of one gradient."""
    if g is None:
        return 0.0, 0
    B, T = shape[0], shape[1]
    if packed and g.dim() >= 1 and g.shape[0] == B * T:
        g = g.reshape(B, T, *g.shape[1:])[:, t:]
    elif g.dim() >= 2 and g.shape[1] == T:
        g = g[:, t:]
    elif g.dim() >= 2 and g.shape[0] == T and g.shape[1] == B:
        g = g[t:]
    else:
        return _GradientHalf(f"the embedding's output {tuple(g.shape)} has no position axis of length {T}")
    fin = torch.isfinite(g)
    return (float(g[fin].abs().max()) if fin.any() else 0.0), int((~fin).sum())


def future_leak(ctx):
    if not ctx.require_causal():   # n/a first: a bidirectional target has no future to leak, noise or not
        how = "" if ctx.adapter.causal is not None else "; causal=True, or --causal yes, if it is meant to be causal"
        return na(f"{ctx.description.causal_from}: a bidirectional layer sees every position{how}", "not_causal")
    ctx.require_repeatable()
    exact = ctx.limit(EXACT_REL)   # the target's own rounding noise, where it keeps some
    x = ctx.sample()
    y = ctx.run(x)
    worst, grads, nonfinite, outputs, half, via = 0.0, [], 0, [], None, ""
    for t in (1, ctx.T // 2, ctx.T - 1):
        x2 = x.clone()
        x2[:, t:] = ctx.sample(k=20 + t)[:, t:]
        d = rel(ctx.run(x2)[:, :t], y[:, :t], "the outputs before t")
        outputs.append({"t": t, "change": d})
        worst = max(worst, d)
        if half is None:
            g = _input_grads(ctx, x, t)
            if isinstance(g, _GradientHalf):
                half = g
            else:
                grads.append(g[0])
                nonfinite += g[1]
                via = g[2]
    g = max(grads) if grads and half is None else None
    bad_grad = g is not None and (g != 0.0 or nonfinite > 0)
    # the measured value is what failed: the outputs' change, else the gradient's non-finite entries, else its size
    measured = worst if worst > exact or not bad_grad else (nonfinite or g)
    detail = ("outputs before t with tokens from t on replaced, relative change: " +
              ", ".join(f"t={o['t']}: {o['change']:.3g}" for o in outputs) +
              (f"; gradient of earlier outputs w.r.t. later inputs{' (against ' + via + ')' if via else ''}: "
               f"max |g| = {g:.3g}, {nonfinite} non-finite"
               if g is not None else f"; gradient: {'n/a' if half.na else 'not run'} ({half.why})"))
    typed, said = _typed_blocks(ctx, x)
    detail += f"; {said}" if said else ""
    block_seen = typed is not None and typed > exact
    if ctx.info.get("insensitive_outputs") and worst <= exact and not bad_grad and not block_seen:
        return inconclusive("insensitive outputs: no later output moves with position 0, and no zero weight to "
                            "fill (attention_doctor/sensitivity.py)", "insensitive_outputs", detail=detail,
                            outputs=outputs)
    cause = "outputs_move" if worst > exact else "later_block_seen" if block_seen else "gradient_nonzero"
    if block_seen and worst <= exact:
        measured = typed
    r = judged(worst > exact or bad_grad or block_seen, measured, f"<= {exact:g}; gradient == 0",
               detail, cause, limit=exact, outputs=outputs, gradient_max=g,
               gradient_nonfinite=None if g is None else nonfinite, later_block=typed)
    if half is not None and half.na:
        r.measurements["not_applicable"] = ["gradient"]
        return r
    return held_in_part(r, {"the gradient half": half.why} if half is not None else {})


BLOCKS = ((3, 7), (9, 13))   # two runs of token type 1, two tokens of type 0 between them (T >= 16)


def _typed_blocks(ctx, x) -> tuple[float | None, str]:
    """Where the target takes token types that mark images (the adapter's typed_forward: transformers'
    token_type_ids where the config declares an image token; Gemma3 attends each contiguous run
    within itself), two runs of type 1: the later run's tokens replaced, every output before it must
    stay (an image may see itself, never a later one). (None, "") where the adapter has no
    typed_forward, (None, why) where the target's types mark no images."""
    fwd = getattr(ctx.adapter, "typed_forward", None)
    if not callable(fwd) or x.shape[1] <= BLOCKS[-1][1]:
        return None, ""
    types = torch.zeros_like(x)
    for a, b in BLOCKS:
        types[:, a:b] = 1
    later = BLOCKS[-1][0]
    x2 = x.clone()
    x2[:, later:BLOCKS[-1][1]] = ctx.sample(k=40)[:, later:BLOCKS[-1][1]]
    try:
        with torch.no_grad():
            y, y2 = ctx.call(fwd, x, types), ctx.call(fwd, x2, types)
    except Unsupported as e:   # no token_type_ids, or types the config says nothing of: that half n/a
        return None, f"token types: n/a ({e.why})"
    d = rel(y2[:, :later], y[:, :later], "the outputs before the later block")
    return d, (f"with token types (runs of type 1 at {BLOCKS[0][0]}-{BLOCKS[0][1] - 1} and {later}-{BLOCKS[-1][1] - 1}), "
               f"the outputs before the later run with its tokens replaced: {d:.3g}")


def _own_keys(c, other):
    """(T_q, T_k) bool, True at each query's own key(s): the diagonal of a square call; else the keys
    that move when the tokens do (`other`: the same call on other tokens; keys that do not are memory
    keys, a zero key, sinks), in order, a block of T_q per stream. None where it cannot be told."""
    T_q, T_k = c.weights.shape[-2:] if c.weights is not None else (c.q.shape[-2], c.k.shape[-2])
    if T_q == T_k:
        return torch.eye(T_q, dtype=torch.bool, device=c.q.device if c.q is not None else c.weights.device)
    if c.k is None or other is None or other.k is None or other.k.shape != c.k.shape or c.k.shape[-2] != T_k:
        return None
    moved = (c.k.double() - other.k.double()).abs().flatten(0, -3).amax((0, -1)) > 0   # (T_k,)
    cols = moved.nonzero().flatten()
    if cols.numel() == 0 or cols.numel() % T_q:
        return None
    own = torch.zeros(T_q, T_k, dtype=torch.bool, device=c.k.device)
    for block in cols.view(-1, T_q):
        own[torch.arange(T_q, device=own.device), block] = True
    return own


def self_visibility(ctx):
    """Every query that sees some key sees its own: its own key is not masked (the call's mask,
    or a fill below MASKED in the scores a softmax got). A weight that underflows to 0 beside
    much larger scores is not a mask, so the weights decide only where no mask is known, and
    there a row whose weights are not finite cannot be judged (never read as a pass). Where keys
    are added to the tokens' own (memory keys, sinks, a second stream), a query's own keys are the
    tokens' keys in order."""
    if ctx.adapter.cross:
        return na("cross-attention: the keys are another sequence's, a query has no key of its own",
                  "cross_attention")
    ctx.require_repeatable()
    _, calls = ctx.probe(ctx.sample())
    _, others = ctx.probe(ctx.sample(k=12))
    others = others if len(others) == len(calls) else [None] * len(calls)
    hidden, rows, n, smallest, unjudged = 0, 0, 0, math.inf, 0
    shown, weighted, contradicted = [], 0, 0   # per call with hidden rows: its output agrees with the mask read
    unread = []   # calls whose query axis could not be measured: not read in an assumed layout
    for c, c2 in zip(calls, others):
        if c.weights is None and not c.complete:
            continue
        if "layout_unmeasured" in c.extra:
            unread.append(c.extra["layout_unmeasured"])
            continue
        w = c.seen_weights().double()
        mine = _own_keys(c, c2)
        if mine is None:
            continue
        mine = mine.expand_as(w)
        visible = c.visible
        applied = applied_mask(c, c2)
        if applied is not None and applied.shape == w.shape:   # what mixed the values, not the softmax's weights
            w = c.extra["applied_weights"].double()
            visible = applied
        own_w = w.abs().masked_fill(~mine, 0.0).amax(-1)
        if visible is not None:   # the mask decides: a row that sees no key is fully_masked_rows' case
            vis = visible.expand_as(w)
            sees, own = vis.any(-1), (vis & mine).any(-1)
        else:
            fin = torch.isfinite(w).all(-1)
            unjudged += int((~fin).sum())
            sees = fin & (w.abs().sum(-1) > 0.5)   # a row of all zeros sees no key
            own = own_w > 0
        n += 1
        rows += int(sees.sum())
        gone = sees & ~own
        hidden += int(gone.sum())
        if gone.any():
            weighted += int((gone & (own_w > 0)).sum())   # the mask hides the own key, the weights give it weight
            shown.append(_own_key_shown(c, w, mine, gone))
        ok = sees & own & torch.isfinite(own_w)
        if ok.any():
            smallest = min(smallest, float(own_w[ok].min()))
    if not n and unread:
        raise NotPerformed(f"{len(unread)} attention call(s) not read: {unread[0]}", "layout_unmeasured")
    if not n:
        raise ctx.unseen("needs the attention weights (no softmax or SDPA call seen)")
    smallest = None if smallest == math.inf else smallest
    detail = (f"{hidden} of {rows} queries (that see some key) over {n} attention call(s) have their own key "
              f"masked; smallest weight on an own key that is visible: " + ("none" if smallest is None else f"{smallest:.3g}"))
    meas = dict(own_key_masked=hidden, queries=rows, calls=n, smallest_own_weight=smallest)
    # no fail without a witness: the mask read, the weights read and the call's own output agree
    contradicted = weighted or (False in shown and True not in shown)
    if hidden and contradicted:
        why = (f"{weighted} of them have weight on their own key in the weights read" if weighted else
               "the call's own output is what its weights give its values with the own key visible, not masked")
        return inconclusive(f"the mask read hides {hidden} queries' own key, while {why}", "readings_disagree",
                            hidden, "== 0 queries with their own key masked", detail, **meas)
    r = judged(hidden > 0, hidden, "== 0 queries with their own key masked",
               detail + (" (a token cannot see itself: a causal mask off by one)" if hidden else ""),
               "own_key_masked", **meas)
    not_run = {"rows with non-finite weights and no known mask": f"{unjudged} row(s)"} if unjudged else {}
    if unread:
        not_run[f"{len(unread)} attention call(s) whose query axis could not be measured"] = unread[0]
    return held_in_part(r, not_run)


def _own_key_shown(c, w, mine, gone) -> bool | None:
    """The call's own output agrees with its own key masked in the rows `gone`: it is farther from
    what the weights with the own key visible (its q . k score put back) give its values than twice
    from what the weights read give. None where the output, values, q, k or scale are not seen."""
    if c.out is None or c.v is None or c.q is None or c.k is None or c.scale is None:
        return None
    try:
        s = c.seen_scores().double()
        alt = c.normalised(torch.where(mine, c.raw(), s))   # the own key's q . k x scale, no mask on it
        out, v = c.out.double(), c.v.double()
        read, other = (out - w @ v).abs().amax(-1), (out - alt @ v).abs().amax(-1)
    except RuntimeError:   # shapes that do not multiply: not this call's values
        return None
    if read.shape != gone.shape:
        return None
    span = float((v.amax(-2) - v.amin(-2)).max().clamp_min(1e-30))
    read, other = read[gone] / span, other[gone] / span
    if not bool(torch.isfinite(read).all() & torch.isfinite(other).all()):
        return None
    return float(other.max()) > max(2 * float(read.max()), 1e-5)


def _end_cache(a):
    """The adapter puts back what its cache set-up changed in the model (CallableLM's end_cache),
    so that the user's module is left as it was given."""
    end = getattr(a, "end_cache", None)
    if callable(end):
        end()


def kv_cache(ctx):
    a = ctx.adapter
    if a.kind != "lm":
        return na("needs a KV cache (a layer has none; an Adapter of kind lm with prefill and step)", "no_kv_cache")
    x = ctx.sample()
    ready = False
    try:
        try:   # the cache's interface first: a target without one is n/a (Unsupported), noise or not
            with torch.no_grad():
                ctx.call(a.prefill, x[:, :-1])
        except (Unreachable, TargetRaised):
            pass   # what these mean is said by the trials below
        ctx.require_repeatable()
        ready = True
    finally:
        if not ready:
            _end_cache(a)
    full = ctx.run(x)
    agree = ctx.limit(AGREE_REL)   # the target's own rounding noise, where it keeps some
    trials, worst, cause = [], 0.0, ""
    tol = f"<= {agree:g}"
    for n in (1, 3):
        P, where = ctx.T - n, "prefill"
        try:
            with torch.no_grad():
                state, pre = ctx.call(a.prefill, x[:, :-n])
                where = "step"
                state, new = ctx.call(a.step, state, x[:, -n:])
        except Unreachable as e:   # a cache of the target's own kind: decoded where the adapter can
            _end_cache(a)
            return _generated(ctx, a, x, e)
        except TargetRaised as e:
            _end_cache(a)
            return _raised(e, f"in {where}, prefill {P} then {n} new", P, n, where, trials=trials)
        for what, got, want in (("prefill", pre, full[:, :-n]), ("step", new, full[:, -n:])):
            if tuple(got.shape) != tuple(want.shape):   # e.g. a step that returns every token's logits
                _end_cache(a)
                return inconclusive(f"{what} returned {tuple(got.shape)}, not {tuple(want.shape)}: prefill returns "
                                    "the prompt's outputs, step the new tokens' only", "adapter_contract")
        d_pre, d_new = rel(pre, full[:, :-n], "the full forward's outputs"), rel(new, full[:, -n:], "the full forward's outputs")
        trials.append({"prefill_tokens": P, "new_tokens": n, "prefill": d_pre, "new": d_new})
        worst = max(worst, d_pre, d_new)
        cause = cause or ("prefill_differs" if d_pre > agree else "new_tokens_differ" if d_new > agree else "")
    _end_cache(a)
    detail = "cached against the full forward: " + "; ".join(
        f"prefill {t['prefill_tokens']} then {t['new_tokens']} new: prefill {t['prefill']:.3g}, new tokens {t['new']:.3g}"
        for t in trials)
    try:
        static, said = _static_decode(ctx, a, x)
    except TargetRaised as e:   # the model's forward raised inside generate()'s static decoding: the row says so
        return _raised(e, f"decoding {STATIC_NEW} tokens through a static cache with generate()", x.shape[1] - STATIC_NEW,
                       1, "static_generate", trials=trials)
    if static is not None:
        worst = max(worst, static)
        cause = cause or ("static_cache_differs" if static > agree else "")
    return judged(worst > agree, worst, tol, f"{detail}; {said}", cause, limit=agree, trials=trials,
                  static_cache=static)


def _raised(e, how, prefill, new, call, **measurements):
    """kv_cache's fail where the target raised on a valid input: where (`how`), and the call it raised in."""
    return row(FAIL, None, "", f"the target raised on a valid input: {e.error} ({how})", "target_raised",
               limit=AGREE_REL, error=e.error, raised_in={"prefill_tokens": prefill, "new_tokens": new, "call": call},
               **measurements)


STATIC_NEW = 3   # tokens decoded through the static cache: each a step of its own, as generate() decodes


def _generated(ctx, a, x, undriven):
    """A cache the doctor does not drive (Unreachable from prefill), where the adapter decodes through
    it (generated_decode: transformers' generate() passes Mamba's cache_params, RWKV's state): STATIC_NEW
    tokens decoded greedily with the cache against the same decoding without it, each step's logits.
    The prefill and multi-token steps are not seen there; without such a driver, or where it cannot
    read the cache, `undriven` stands (inconclusive)."""
    decode = getattr(a, "generated_decode", None)
    if not callable(decode):
        raise undriven
    try:
        with torch.no_grad():
            cached, uncached = ctx.call(decode, x[:, :-STATIC_NEW], STATIC_NEW)
    except Unreachable as e:
        raise Unreachable(f"{undriven.why}; {e.why}") from None
    except TargetRaised as e:
        return _raised(e, f"decoding {STATIC_NEW} tokens with its cache through generate()", x.shape[1] - STATIC_NEW,
                       1, "generate")
    d = rel(cached, uncached, "the logits decoded without the cache")
    agree = ctx.limit(AGREE_REL)   # the target's own rounding noise, where it keeps some
    return judged(d > agree, d, f"<= {agree:g}",
                  f"its own cache, driven by its generate(): {STATIC_NEW} tokens decoded after {x.shape[1] - STATIC_NEW} "
                  f"with the cache against without it: {d:.3g} (the prefill and multi-token steps not seen)",
                  "new_tokens_differ" if d > agree else "", limit=agree, generated=d)


def _static_decode(ctx, a, x) -> tuple[float | None, str]:
    """Where the adapter decodes through a preallocated cache (static_decode: transformers' StaticCache
    under generate()), each decoded token's logits against the same decoding through the cache grown
    token by token: the static cache holds empty slots past the tokens, which a mask must hide. (None,
    why) where it has none."""
    decode = getattr(a, "static_decode", None)
    if not callable(decode):
        return None, "no static cache (the adapter offers none)"
    try:
        with torch.no_grad():
            static, grown = ctx.call(decode, x[:, :-STATIC_NEW], STATIC_NEW)
    except Unsupported as e:   # the release or the model has none: that half is not applicable, the rest stands
        return None, f"static cache: n/a ({e.why})"
    d = rel(static, grown, "the logits decoded through the grown cache")
    return d, (f"decoded {STATIC_NEW} after {x.shape[1] - STATIC_NEW} through a static cache against the grown one: "
               f"{d:.3g}")
