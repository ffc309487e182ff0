"""Sliding window: where the target declares attention windows (an Adapter's windows(): the window
size and, per attention layer, whether it slides), a sequence longer than the window shows whether
each layer does what it declares. Declared uniformly (every layer sliding, or a window named and
switched off on every layer): a query's output must not move (sliding) or must move (switched off)
when tokens beyond the stacked layers' reach change. Declared per layer (sliding and full layers
mixed), or beside layers of no softmax attention (a recurrence or a convolution carries a token past
any window): the perturbation cannot tell the layers apart at the output, so each attention call's
own mask is read instead (the keys its scores hide). A window named without the layers that take it
(a config with a window and no per-layer kinds: Mistral slides every layer, Gemma2 before
transformers' layer_types alternates in its code): outputs beyond every stacked window that do not
move pass; where they move, the calls' masks must show the window applied on at least one layer."""
import torch

from attention_doctor.checks.common import EXACT_REL, applied_mask, judged, na, rel
from attention_doctor.signals import NotPerformed, Unreachable

MAX_T = 512    # the longest sequence the check runs (a window the stacked layers reach beyond: inconclusive)
CHANGED = 4    # tokens 0..CHANGED-1 are replaced
MARGIN = 8     # queries beyond the reach, compared


def _declared(ctx):
    """(window, slides per attention layer, whether other layers (no softmax attention: linear
    attention, convolutions) run between them), from the adapter; slides None where the layers that
    take the window are not declared; Unsupported where no window is declared."""
    w, layers = ctx.call(ctx.adapter.windows)
    if layers is None:
        return int(w), None, False
    return (int(w), [s if isinstance(s, str) else bool(s) for s in layers if s is not None],
            any(s is None for s in layers))


def _far(T: int, w: int) -> torch.Tensor:
    """(T, T) bool: key j lies beyond query i's window, i - j > w (a window of w or w + 1 keys: both
    conventions transformers has used keep these out)."""
    i = torch.arange(T)
    return (i[:, None] - i[None, :]) > w


def _token_mask(c, other):
    """A call's mask over the tokens' keys: where other columns were concatenated to q k^T's scores
    (attention sinks' logits: GPT-OSS, MiMo), only the block of the tokens' keys; where the product
    with the values took other weights than the softmax's and their zeros are a mask (a window
    applied after it, the weights zeroed and renormalised: common.applied_mask, `other` the same
    call on other tokens), the keys those weights give weight to: the mask read from the scores is
    not what mixed the values; None: not known."""
    applied = applied_mask(c, other)
    if applied is not None and c.visible is not None and applied.shape[-2:] == c.visible.shape[-2:]:
        return applied
    block = c.extra.get("key_block")
    return c.visible if c.visible is None or block is None else c.visible[..., block]


def _per_call(ctx, w: int, slides: list[bool | str] | None) -> dict:
    """Each square attention call's mask against its layer's declaration (None: undeclared, the masks
    read alone), calls taken in layer order."""
    T = w + 1 + MARGIN
    if T > MAX_T:
        raise NotPerformed(f"window {w}: the check runs at most {MAX_T} tokens (a smaller window, as the zoo's "
                           "shrunk configs set, enables it)", "window_too_long")
    _, calls = ctx.probe(ctx.sample(T=T, k=60))
    unread = [c.extra["layout_unmeasured"] for c in calls if "layout_unmeasured" in c.extra]
    if unread:   # its mask's queries unknown: not read in an assumed layout
        raise NotPerformed(f"{len(unread)} attention call(s) not read: {unread[0]}", "layout_unmeasured")
    _, others = ctx.probe(ctx.sample(T=T, k=61))   # the same calls on other tokens: whether zeros are a mask
    others = others if len(others) == len(calls) else [None] * len(calls)
    square = [(c, m) for c, m in ((c, _token_mask(c, o)) for c, o in zip(calls, others))
              if m is not None and m.shape[-1] == T and m.shape[-2] in (1, T)]
    if not square:   # calls seen (a fused kernel) are attention already: no forward to rule it out
        why = "no attention call whose mask the doctor can read (a fused kernel)"
        raise NotPerformed(why, "scores_unseen") if calls else ctx.unseen(why)
    if slides is None:
        matched = [(None, m, None) for _, m in square]
    elif len(square) == len(slides):
        matched = [(n, m, s) for n, ((_, m), s) in enumerate(zip(square, slides))]
    else:   # more calls than layers (a layer looped) or fewer: each call to the layer whose module made it
        matched = _by_module(ctx, square)
        if matched is None:
            raise NotPerformed(f"{len(square)} attention calls seen against {len(slides)} attention layers declared: "
                               "the calls cannot be matched to the layers", "scores_unseen")
    far = _far(T, w)
    layers = []
    for n, (i, m, s) in enumerate(matched):
        vis = m.expand(*m.shape[:-2], T, T).reshape(-1, T, T).any(0).cpu()
        seen_far = int((vis & far).sum())
        layers.append({"layer": n if i is None else i, "sliding": s, "far_keys_visible": seen_far,
                       "far_keys": int(far.sum())})
    return {"T": T, "layers": layers}


def _by_module(ctx, square) -> list | None:
    """[(declared layer, mask, its declaration)] per call, each call given to the declared layer whose
    module it ran inside (the adapter's window_layers()); None where the adapter cannot say, a call
    ran in no declared layer or in one of no softmax attention, or a softmax layer made no call."""
    names = ctx.call(ctx.adapter.window_layers)
    _, declared = ctx.call(ctx.adapter.windows)
    if not names or declared is None or len(names) != len(declared):
        return None
    out = []
    for c, m in square:
        i = next((i for i, n in enumerate(names) if c.module == n or c.module.startswith(n + ".")), None)
        if i is None or declared[i] is None:
            return None
        out.append((i, m, declared[i] if isinstance(declared[i], str) else bool(declared[i])))
    if {i for i, s in enumerate(declared) if s is not None} - {i for i, _, _ in out}:
        return None
    return out


def _perturbed(ctx, w: int, slides: list[bool]) -> dict:
    """The outputs of the queries beyond every layer's reach with tokens 0..CHANGED-1 replaced."""
    reach = len(slides) * (w + 1)
    first = CHANGED - 1 + reach + 1           # the first query no stacked window reaches token CHANGED-1 from
    T = first + MARGIN
    if T > MAX_T:
        raise NotPerformed(f"window {w} over {len(slides)} layers reaches {reach} tokens: the check runs at most "
                           f"{MAX_T} (a smaller window, as the zoo's shrunk configs set, enables it)", "window_too_long")
    ctx.require_repeatable()
    x = ctx.sample(T=T, k=61)
    y = ctx.run(x)
    x2 = x.clone()
    x2[:, :CHANGED] = ctx.sample(T=T, k=62)[:, :CHANGED]
    return {"T": T, "first_query": first, "change": rel(ctx.run(x2)[:, first:], y[:, first:],
                                                          "the outputs beyond the window")}


def _undeclared(ctx, w: int, limit: str):
    """A window named without the layers that take it: every seen attention call's layer assumed
    sliding, outputs beyond the stacked windows that do not move pass; where they move, a layer that
    does not slide may be the target's design, so each call's mask decides: the window applied on no
    layer fails, on some passes, unreadable masks leave it inconclusive."""
    said = f"window {w}, the layers that take it not declared"
    _, calls = ctx.probe(ctx.sample(T=min(w + 1 + MARGIN, MAX_T), k=60))
    if not calls:
        raise ctx.unseen("no attention call seen: the layers the window would apply to are unknown")
    p = _perturbed(ctx, w, [True] * len(calls))
    how = (f"{said}; T={p['T']}: the outputs from query {p['first_query']} on, beyond the windows of "
           f"{len(calls)} stacked attention layers, move by {p['change']:.3g} with tokens 0..{CHANGED - 1} replaced")
    exact = ctx.limit(EXACT_REL)   # the target's own rounding noise, where it keeps some
    if p["change"] <= exact:
        return judged(False, p["change"], limit, how, window=w, T=p["T"], change=p["change"], limit=exact)
    try:
        c = _per_call(ctx, w, None)
    except NotPerformed as e:
        raise NotPerformed(f"{how}; which layers are full by design cannot be told: {e.why}", e.cause) from None
    windowed = [x["layer"] for x in c["layers"] if not x["far_keys_visible"]]
    how += ("; per attention call, the keys beyond the window it leaves visible: "
            + ", ".join(f"layer {x['layer']} {x['far_keys_visible']} of {x['far_keys']}" for x in c["layers"]))
    return judged(not windowed, float(len(c["layers"]) - len(windowed)), "the window applied on at least one layer",
                  how, "window_ignored", window=w, T=c["T"], change=p["change"], layers=c["layers"])


def sliding_window(ctx):
    w, slides, others = _declared(ctx)   # Unsupported (n/a) where the target declares no window
    if slides is not None and not slides:
        return na("declares a window but no attention layer", "no_window")
    kinds = sorted({s for s in slides or () if isinstance(s, str)})   # attention kinds of the target's own
    if slides is not None and all(isinstance(s, str) for s in slides):
        raise Unreachable(f"only attention layers of kinds of its own ({', '.join(kinds)}): what the window "
                          "does there is not declared")
    if not ctx.require_causal():
        return na(f"{ctx.description.causal_from}: a sliding window is a causal target's", "not_causal")
    exact = ctx.limit(EXACT_REL)   # the target's own rounding noise, where it keeps some
    limit = f"<= {exact:g} (sliding), > {exact:g} (switched off)"
    if slides is None:
        return _undeclared(ctx, w, limit)
    judged_layers = [s for s in slides if not isinstance(s, str)]
    said = f"window {w}, {sum(judged_layers)} of {len(judged_layers)} attention layers declared sliding"
    if kinds:   # matched to their calls by order, not judged
        said += f" (beside {len(slides) - len(judged_layers)} of kinds of its own: {', '.join(kinds)})"
    if others:   # a recurrent or convolutional layer carries any token past every window: read each call's mask
        said += " beside layers of no softmax attention"
    if not kinds and (all(slides) or not any(slides)) and not others:
        p = _perturbed(ctx, w, slides)
        moved = p["change"] > exact
        sliding = all(slides)
        bad = moved if sliding else not moved
        how = (f"{said}; T={p['T']}: the outputs from query {p['first_query']} on, beyond every stacked window, "
               f"move by {p['change']:.3g} with tokens 0..{CHANGED - 1} replaced")
        return judged(bad, p["change"], limit, how, "window_ignored" if sliding else "window_applied",
                      window=w, sliding_layers=slides, T=p["T"], change=p["change"], limit=exact)
    c = _per_call(ctx, w, slides)
    ignored = [x["layer"] for x in c["layers"] if x["sliding"] is True and x["far_keys_visible"]]
    applied = [x["layer"] for x in c["layers"] if x["sliding"] is False and x["far_keys_visible"] < x["far_keys"]]
    name = {True: "sliding", False: "full"}
    how = (f"{said}; T={c['T']}, per attention call, the keys beyond the window it leaves visible: "
           + ", ".join(f"layer {x['layer']} ({name.get(x['sliding'], x['sliding'])}) {x['far_keys_visible']} "
                       f"of {x['far_keys']}" for x in c["layers"]))
    cause = "window_ignored" if ignored else "window_applied"
    return judged(bool(ignored or applied), float(len(ignored) + len(applied)), "0 layers against their declaration",
                  how, cause, window=w, sliding_layers=slides, T=c["T"], layers=c["layers"])
