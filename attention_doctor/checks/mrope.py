"""multimodal_positions: a target that takes position ids of several rows (M-RoPE: temporal,
height, width) with an image's tokens laid out as an image's (one temporal value, a grid of heights
and widths, text after it from the grid's largest position on), no pixels. Its outputs with no
attention mask must equal those with an all-ones mask (a mask builder that reads the positions as
packed sequences cuts the row at the image), with positions given and with the positions the model
makes itself from the image's grid. Whether it reads multi-row positions is measured: text positions
given as rows must give what its own text positions give."""
import torch

from attention_doctor.checks.common import AGREE_REL, held_in_part, judged, na, rel
from attention_doctor.signals import TargetRaised, Unreachable, Unsupported

ROWS, START, SIDE = 3, 4, 2   # rows of positions; where the image starts; its side in merged patches


def _image_row(ctx):
    """(ids (1, T), positions (ROWS, 1, T)): text, an image of SIDE x SIDE tokens at START (after the
    vision start token where one is declared), text after it."""
    a, T = ctx.adapter, ctx.T
    x = ctx.sample(1, T, k=94)
    img = getattr(a, "image_token", lambda: None)()   # ids an adapter does not declare: the positions alone
    start = getattr(a, "vision_start_token", lambda: None)()
    img, start = (t if t is not None and 0 <= t < a.vocab_size else None for t in (img, start))   # outside: not placed
    n = SIDE * SIDE
    if img is not None:
        x[:, START:START + n] = img
        x[:, START + n:] = torch.where(x[:, START + n:] == img, (img + 1) % a.vocab_size, x[:, START + n:])
    if start is not None:
        x[:, START - 1] = start
    pos = torch.arange(T).repeat(ROWS, 1)
    grid = torch.arange(n)
    pos[0, START:START + n] = START
    pos[1, START:START + n] = START + grid // SIDE
    pos[2, START:START + n] = START + grid % SIDE
    pos[:, START + n:] = torch.arange(START + SIDE, START + SIDE + T - START - n)
    return x, pos[:, None].to(x.device)


def multimodal_positions(ctx):
    a = ctx.adapter
    if not callable(getattr(a, "rows_forward", None)):
        return na("takes no multi-row position ids (an Adapter's rows_forward enables it)", "no_multirow_positions")
    agree = ctx.limit(AGREE_REL)
    text = ctx.sample(1, ctx.T, k=93)
    ones = torch.ones_like(text, dtype=torch.bool)
    rows = torch.arange(ctx.T, device=text.device).repeat(ROWS, 1, 1)
    with torch.no_grad():
        try:
            as_rows = ctx.call(a.rows_forward, text, rows, ones)
        except TargetRaised as e:   # position ids of several rows refused: it takes none
            return na(f"position ids of {ROWS} rows raise ({e.error[:120]}): it takes no multi-row positions",
                      "no_multirow_positions")
        except Unsupported as e:
            return na(e.why, "no_multirow_positions")
        own = ctx.run(text, ones)
        if as_rows.shape != own.shape or rel(as_rows, own, "its own text positions") > agree:
            return na(f"text positions given as {ROWS} rows give other outputs than its own (shape "
                      f"{tuple(as_rows.shape)} against {tuple(own.shape)}): it does not read them as multi-row "
                      "positions", "no_multirow_positions")
        others = rows.clone()
        others[1:] = others[1:].flip(-1)   # the rows after the first reversed (a shift alone: the same relative rotations)
        if rel(ctx.call(a.rows_forward, text, others, ones), as_rows, "the outputs with equal rows") <= agree:
            return na("its outputs do not move with the position rows after the first: it reads no multi-row "
                      "positions (a forward that ignores position_ids with a mask given)", "no_multirow_positions")
        x, pos = _image_row(ctx)
        given = {"masked": ctx.call(a.rows_forward, x, pos, ones)}
        given["unmasked"] = ctx.call(a.rows_forward, x, pos, None)   # its raise here is the failure (target_raised)
        ctx.require_repeatable()   # after: a forward that raises with no mask leaves the repeatability undecided
        measured = {"positions_given": rel(given["unmasked"], given["masked"], "the all-ones mask's outputs")}
        not_run, na_parts, matches = {}, {}, None
        try:
            if not callable(getattr(a, "own_image_forward", None)):
                raise Unsupported("no positions of its own from an image's grid (an Adapter's own_image_forward)")
            mine = ctx.call(a.own_image_forward, x, SIDE, ones)
        except Unreachable as e:   # an image grid it takes but the doctor cannot lay out: that part not run
            not_run["own_positions"] = e.why
        except Unsupported as e:   # it takes no image grid: that part does not exist (n/a), the given positions judge
            na_parts["own_positions"] = e.why
        except TargetRaised as e:   # an image grid it takes but cannot run without pixels: that part not run
            not_run["own_positions"] = e.error
        else:
            mine_unmasked = ctx.call(a.own_image_forward, x, SIDE, None)
            measured["own_positions"] = rel(mine_unmasked, mine, "the all-ones mask's outputs (its own positions)")
            matches = rel(mine, given["masked"], "the outputs with the image's positions given")
    worst = max(measured.values())
    detail = ("an image of " + f"{SIDE}x{SIDE} tokens, no mask against an all-ones mask: "
              + ", ".join(f"{k} {v:.3g}" for k, v in measured.items())
              + ("" if matches is None else f"; its own positions against those given: {matches:.3g}"))
    detail += "".join(f"; {k}: n/a, {why}" for k, why in na_parts.items())
    r = judged(worst > agree, worst, f"<= {agree:g}", detail, "unmasked_differs", limit=agree,
               own_matches_given=matches, **measured, **({"not_applicable": list(na_parts)} if na_parts else {}))
    return held_in_part(r, not_run)
