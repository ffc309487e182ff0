"""Dropout off in eval, the future leak, self-visibility, and the KV cache."""
import torch

from attention_doctor.adapters import Unsupported
from attention_doctor.checks.common import (AGREE_REL, EXACT_REL, TargetRaised, inconclusive, na, not_repeatable,
                                            rel, row, unseen, unsupported)
from attention_doctor.checks.record import Check


def eval_dropout(ctx):
    x = ctx.sample()
    y1, y2 = ctx.run(x), ctx.run(x)
    same = torch.equal(torch.nan_to_num(y1), torch.nan_to_num(y2))
    ctx.deterministic = same
    d = float((y1.double() - y2.double()).abs().nan_to_num().max())
    p = 0.0 if same else max((c.dropout_p for c in ctx.probe(x)[1]), default=0.0)
    why = f"; scaled_dot_product_attention got dropout_p={p:g} in eval" if p else ""
    return row("eval_dropout", "pass" if same else "fail", d, "== 0 (bit-identical)",
               f"two eval calls on the same input differ by up to {d:.3g}{why}" if not same
               else "two eval calls are bit-identical",
               "" if same else "sdpa_dropout_p" if p else "random_in_eval")


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


def _find_causal(ctx, x, y):
    """A layer that did not say: causal if its attention calls mask every later key (a bug that
    leaks, softmax over the queries, still reads as causal), else if position 0 does not read
    position T-1."""
    if _masks_later_keys(ctx.probe(x)[1]):
        ctx.causal = True
        ctx.info["causal"] = "causal (found: its attention calls mask every later key)"
        return True
    x2 = x.clone()
    x2[:, -1] = ctx.sample(k=11)[:, -1]
    d = rel(ctx.run(x2)[:, 0], y[:, 0])
    ctx.causal = d == 0.0
    ctx.info["causal"] = "causal (found: position 0 does not read position T-1)" if ctx.causal else \
        "not causal (found: position 0 reads position T-1, and no attention call masks the later keys)"
    return ctx.causal


def _input_grads(ctx, x, t):
    """d (weighted outputs before t) / d (inputs at and after t): ((the largest finite |.|, how many
    are not finite), None) or (None, why not)."""
    a = ctx.adapter
    w = torch.randn(x.shape[0], t, 1, generator=ctx.gen(5)).to(a.device)
    if a.kind == "layer":
        xi = x.clone().requires_grad_(True)
        y = ctx.run(xi, grad=True)
        return _grad((y[:, :t].double() * w).sum(), xi, x.shape, t)
    emb = a.embedding()
    if emb is None:
        return None, "no input embedding to differentiate against"
    got = []
    h = emb.register_forward_hook(lambda m, i, o: got.append(o))
    try:
        with torch.enable_grad():
            y = ctx.run(x, grad=True)
    finally:
        h.remove()
    if len(got) != 1 or not got[0].requires_grad:
        return None, "the input embedding's output is not differentiable here"
    return _grad((y[:, :t].double() * w).sum(), got[0], x.shape, t)


def _grad(loss, wrt, shape, t):
    """(the largest finite |d loss / d wrt| at positions t.., the non-finite count) (wrt (B, T, ...)
    or (T, B, ...): XLNet's embedding is time-major), or (None, why not)."""
    try:
        g, = torch.autograd.grad(loss, wrt, allow_unused=True)
    except Exception as e:   # a backward the target refuses in eval mode (Reformer's reversible layers)
        return None, f"its backward raised in eval mode ({type(e).__name__}: {str(e)[:80]})"
    if g is None:
        return (0.0, 0), None
    B, T = shape[0], shape[1]
    if g.dim() >= 2 and g.shape[1] == T:
        g = g[:, t:]
    elif g.dim() >= 2 and g.shape[0] == T and g.shape[1] == B:
        g = g[t:]
    else:
        return None, f"the embedding's output {tuple(g.shape)} has no position axis of length {T}"
    fin = torch.isfinite(g)
    return (float(g[fin].abs().max()) if fin.any() else 0.0, int((~fin).sum())), None


def future_leak(ctx):
    if ctx.deterministic is False:
        return not_repeatable("future_leak")
    x = ctx.sample()
    y = ctx.run(x)
    causal = ctx.adapter.causal if ctx.adapter.causal is not None else _find_causal(ctx, x, y)
    ctx.causal = causal
    if not causal:
        how = "" if ctx.adapter.causal is not None else "; causal=True, or --causal yes, if it is meant to be causal"
        return na("future_leak", f"{ctx.info.get('causal', 'not causal')}: a bidirectional layer sees every position{how}")
    worst, grads, nonfinite, at, why = 0.0, [], 0, [], None
    for t in (1, ctx.T // 2, ctx.T - 1):
        x2 = x.clone()
        x2[:, t:] = ctx.sample(k=20 + t)[:, t:]
        d = rel(ctx.run(x2)[:, :t], y[:, :t])
        at.append(f"t={t}: {d:.3g}")
        worst = max(worst, d)
        g, why = _input_grads(ctx, x, t)
        if g is not None:
            grads.append(g[0])
            nonfinite += g[1]
    g = max(grads) if grads else None
    bad_grad = g is not None and (g != 0.0 or nonfinite > 0)
    # the measured value is what failed: the outputs' change, else the gradient's non-finite entries, else its size
    measured = worst if worst > EXACT_REL or not bad_grad else (nonfinite or g)
    detail = ("outputs before t with tokens from t on replaced, relative change: " + ", ".join(at) +
              (f"; gradient of earlier outputs w.r.t. later inputs: max |g| = {g:.3g}, {nonfinite} non-finite"
               if g is not None else f"; gradient: n/a ({why})"))
    bad = worst > EXACT_REL or bad_grad
    cause = "" if not bad else "outputs_move" if worst > EXACT_REL else "gradient_nonzero"
    return row("future_leak", "fail" if bad else "pass", measured, f"<= {EXACT_REL:g}; gradient == 0", detail, cause)


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
    much larger scores is not a mask, so the weights decide only where no mask is known. Where
    keys are added to the tokens' own (memory keys, sinks, a second stream), a query's own keys
    are the tokens' keys in order."""
    if ctx.deterministic is False:
        return not_repeatable("self_visibility")
    if getattr(ctx.adapter, "cross", False):
        return na("self_visibility", "cross-attention: the keys are another sequence's, a query has no key of its own")
    _, calls = ctx.probe(ctx.sample())
    _, others = ctx.probe(ctx.sample(k=12))
    others = others if len(others) == len(calls) else [None] * len(calls)
    hidden, rows, n, smallest = 0, 0, 0, float("inf")
    for c, c2 in zip(calls, others):
        if c.weights is None and not c.complete:
            continue
        w = c.seen_weights().double().nan_to_num(0.0)
        mine = _own_keys(c, c2)
        if mine is None:
            continue
        mine = mine.expand_as(w)
        sees = w.abs().sum(-1) > 0.5   # a row that sees no key (all zero, or NaN) is fully_masked_rows' case
        own_w = w.abs().masked_fill(~mine, 0.0).amax(-1)
        if c.visible is not None:
            own = (c.visible.expand_as(w) & mine).any(-1)
        else:
            own = own_w > 0
        n += 1
        rows += int(sees.sum())
        hidden += int((sees & ~own).sum())
        if (sees & own).any():
            smallest = min(smallest, float(own_w[sees & own].min()))
    if not n:
        return unseen("self_visibility", "needs the attention weights (no softmax or SDPA call seen)")
    return row("self_visibility", "fail" if hidden else "pass", hidden, "== 0 queries with their own key masked",
               f"{hidden} of {rows} queries (that see some key) over {n} attention call(s) have their own key "
               f"masked; smallest weight on an own key that is visible: {smallest:.3g}"
               + (" (a token cannot see itself: a causal mask off by one)" if hidden else ""),
               "own_key_masked" if hidden else "")


def _target(fn, *args):
    """Call the target's prefill/step: what it raises is the target's (TargetRaised)."""
    try:
        return fn(*args)
    except Unsupported:
        raise
    except Exception as e:
        raise TargetRaised(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]) from e


def kv_cache(ctx):
    a = ctx.adapter
    if a.kind != "lm":
        return na("kv_cache", "needs a KV cache (a layer has none; an Adapter of kind lm with prefill and step)")
    if ctx.deterministic is False:
        return not_repeatable("kv_cache")
    x = ctx.sample()
    full = ctx.run(x)
    worst, parts, cause = 0.0, [], ""
    try:
        for n in (1, 3):
            with torch.no_grad():
                state, pre = _target(a.prefill, x[:, :-n])
                state, new = _target(a.step, state, x[:, -n:])
            for what, got, want in (("prefill", pre, full[:, :-n]), ("step", new, full[:, -n:])):
                if tuple(got.shape) != tuple(want.shape):   # e.g. a step that returns every token's logits
                    return inconclusive("kv_cache", f"{what} returned {tuple(got.shape)}, not {tuple(want.shape)}: "
                                        "prefill returns the prompt's outputs, step the new tokens' only",
                                        "adapter_contract")
            d_pre, d_new = rel(pre, full[:, :-n]), rel(new, full[:, -n:])
            parts.append(f"prefill {ctx.T - n} then {n} new: prefill {d_pre:.3g}, new tokens {d_new:.3g}")
            worst = max(worst, d_pre, d_new)
            cause = cause or ("prefill_differs" if d_pre > AGREE_REL else "new_tokens_differ" if d_new > AGREE_REL else "")
    except Unsupported as e:
        return unsupported("kv_cache", e)
    return row("kv_cache", "fail" if worst > AGREE_REL else "pass", worst, f"<= {AGREE_REL:g}",
               "cached against the full forward: " + "; ".join(parts), cause)


CHECKS = (
    Check(eval_dropout, does="two eval calls on the same input",
          fails_when="they differ at all",
          tolerance="bit-identical: nothing random may run in eval",
          applies="every target", thread="meta-pytorch/torchtune #1791",
          causes={"sdpa_dropout_p": "scaled_dot_product_attention got dropout_p > 0 in eval",
                  "random_in_eval": "something else random ran in eval"}),
    Check(future_leak, does="replaces the tokens from t on (t = 1, T/2, T-1); the gradient of outputs before t "
                            "w.r.t. inputs from t on (where the target's backward refuses eval mode, the replacement "
                            "alone, said so)",
          fails_when="an earlier output moves, or the gradient is not exactly 0",
          tolerance="1e-6: masked keys contribute exp(-huge) = 0 exactly, so a healthy model moves by 0; runs "
                    "after eval_dropout (dropout left on is not a leak)",
          applies="causal targets (LMs; a layer said or found causal)",
          thread="jsbaan/transformer-from-scratch #6", targets=("head_merge_no_transpose",),
          causes={"outputs_move": "an earlier output moves when later tokens change",
                  "gradient_nonzero": "outputs do not move measurably, but an earlier output's gradient reaches a "
                                      "later input"}),
    Check(self_visibility, does="whether each query's own key is masked (the call's mask, or a fill in the scores "
                                "its softmax got; the weights where no mask is known)",
          fails_when="a query that sees some key has its own key masked",
          tolerance="0 such queries: a causal mask keeps the diagonal (a weight that underflows to 0 beside much "
                    "larger scores is not a mask)",
          applies="targets whose attention calls the doctor sees", thread="RVC-Boss/GPT-SoVITS #965",
          targets=("causal_off_by_one",), causes={"own_key_masked": "a query's own key is masked"}),
    Check(kv_cache, does="prefill T-1 (T-3) tokens, then 1 (3) new ones (T_q != T_k), against the full forward",
          fails_when="logits differ",
          tolerance="1e-5: the same sums in another order",
          applies="LMs with a KV cache (transformers' past_key_values, this project's KVCache, an Adapter's "
                  "prefill/step)",
          thread="pytorch/pytorch #108108", targets=("causal_kv_cache",),
          causes={"prefill_differs": "the prefill's outputs differ from the full forward's",
                  "new_tokens_differ": "the new tokens' outputs after the cache differ (a causal mask aligned "
                                       "top-left when T_q != T_k)"}),
)
