"""encoder_decoder: an encoder-decoder's decoder must not see the encoder input's padding. One
source alone, right-padded and left-padded (its mask False on the pads), the pads holding two
different fillings: the decoder's logits on the same decoder ids, and greedy generate() with the
decoder's cache and without, must not move with what the pads hold, and right padding (which shifts
no source position) must give what the source alone gives. The cached decoding against the
uncached one is measured, not judged: the decoder's cache is kv_cache's (prefill and step, on the
decoder driven as an LM); generate()'s uncached path differs from plain forwards on some models
(FSMT at 5.23: its cached decoding equals them), not triaged as attention's."""
import torch

from attention_doctor.checks.common import AGREE_REL, held_in_part, judged, na, rel
from attention_doctor.signals import Unreachable

SOURCE, PADS, DECODER, NEW = 6, 5, 6, 6   # source tokens, pads, decoder ids of the forward, tokens generated


def _padded(a, ctx, src):
    """{name: (ids, mask)} of src alone and padded right and left, each padding filled two ways."""
    ones = torch.ones_like(src, dtype=torch.bool)
    zeros = torch.zeros(src.shape[0], PADS, dtype=torch.bool, device=src.device)
    out = {"alone": (src, ones)}
    for k, fill in enumerate("AB"):
        junk = ctx.call(a.source_tokens, src.shape[0], PADS, ctx.gen(91 + k))
        out[f"right_{fill}"] = (torch.cat([src, junk], 1), torch.cat([ones, zeros], 1))
        out[f"left_{fill}"] = (torch.cat([junk, src], 1), torch.cat([zeros, ones], 1))
    return out


def _compared(outs: dict) -> dict:
    """The relative differences that must be 0 up to rounding: what the pads hold (right, left), and
    right padding against the source alone."""
    return {"right_pads": rel(outs["right_B"], outs["right_A"], "the right-padded outputs"),
            "left_pads": rel(outs["left_B"], outs["left_A"], "the left-padded outputs"),
            "right_vs_alone": rel(outs["right_A"], outs["alone"], "the source alone's outputs")}


def encoder_decoder(ctx):
    a = ctx.adapter
    if not callable(getattr(a, "encoded_forward", None)):
        return na("no encoder input beside the decoder's (a decoder-only target; an Adapter's encoded_forward "
                  "and encoded_decode enable it)", "no_encoder")
    ctx.require_repeatable()
    agree = ctx.limit(AGREE_REL)
    src = ctx.call(a.source_tokens, 1, SOURCE, ctx.gen(90))
    inputs = _padded(a, ctx, src)
    dec = ctx.sample(1, DECODER, k=93)
    with torch.no_grad():
        forward = _compared({k: ctx.call(a.encoded_forward, s, m, dec) for k, (s, m) in inputs.items()})
    measured, not_run, decoded = {"forward": forward}, {}, {}
    for cached in (True, False):
        part = "generate_cached" if cached else "generate_uncached"
        try:
            with torch.no_grad():
                decoded[cached] = {k: ctx.call(a.encoded_decode, s, m, NEW, cached) for k, (s, m) in inputs.items()}
        except Unreachable as e:   # no generate() the doctor can drive: that part not run (inconclusive), never a pass
            not_run[part] = e.why
            continue
        measured[part] = _compared(decoded[cached])
    cache = None   # measured, not judged: generate()'s own paths (the decoder's cache is kv_cache's, prefill and step)
    if len(decoded) == 2:
        cache = rel(decoded[True]["alone"], decoded[False]["alone"], "the uncached decoding")
    worst = max(v for m in measured.values() for v in m.values())
    detail = "; ".join(f"{part}: " + ", ".join(f"{k} {v:.3g}" for k, v in m.items()) for part, m in measured.items())
    detail += "" if cache is None else f"; cached against uncached decoding, source alone (not judged): {cache:.3g}"
    r = judged(worst > agree, worst, f"<= {agree:g}", detail, "pads_seen",
               forward=forward, generate_cached=measured.get("generate_cached"),
               generate_uncached=measured.get("generate_uncached"), cache=cache, limit=agree)
    return held_in_part(r, not_run)
