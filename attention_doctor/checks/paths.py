"""Path agreement: where the target switches between attention paths, the paths agree with each
other and each path's attention calls agree with the textbook attention on their own q, k, v."""
import torch

from attention_doctor.adapters import Unsupported
from attention_doctor.checks.common import AGREE_REL, TargetRaised, na, rel, row, unseen, unsupported
from attention_doctor.checks.record import Check


def _reference_error(calls) -> float | None:
    errs = []
    for c in calls:
        if not c.complete:
            continue
        ref = c.reference(torch.float64)
        live = torch.ones(ref.shape[:-1], dtype=torch.bool, device=ref.device)
        if c.visible is not None:
            live = c.visible.expand(ref.shape[:-1] + (c.k.shape[-2],)).any(-1)
        errs.append(rel(c.out[live], ref[live]))
    return max(errs) if errs else None


def path_agreement(ctx):
    a = ctx.adapter
    try:
        paths = a.paths()
    except Unsupported as e:
        return unsupported("path_agreement", e)
    if len(paths) < 2:
        return na("path_agreement", "no switch between attention paths (an Adapter's paths() and use_path() "
                  "enable it)")
    x = ctx.sample(k=70)
    xp, m = ctx.left_padded(k=71)
    outs, parts, worst, compared = {}, [], 0.0, 0
    for p in paths:
        try:
            with a.use_path(p):
                y, calls = ctx.probe(x)
                try:
                    yp = ctx.run(xp, m)[m]
                except (Unsupported, TargetRaised):   # a mask the target rejects: padding's failure
                    yp = None
        except TargetRaised as e:
            return row("path_agreement", "fail", None, "", f"path {p} raised {e}", "target_raised")
        outs[p] = (y, yp)
        e = _reference_error(calls)
        compared += e is not None
        parts.append(f"{p}: calls against the textbook attention {'n/a' if e is None else f'{e:.3g}'}")
        worst = max(worst, e or 0.0)
    first, cause = paths[0], "call_vs_textbook" if worst > AGREE_REL else ""
    for p in paths[1:]:
        d = rel(outs[p][0], outs[first][0])
        if outs[p][1] is not None and outs[first][1] is not None:
            d = max(d, rel(outs[p][1], outs[first][1]))
        parts.append(f"{p} against {first}: {d:.3g}")
        cause = cause or ("paths_differ" if d > AGREE_REL else "")
        worst = max(worst, d)
    detail = "; ".join(parts) + " (padded batch: real tokens only)"
    if worst <= AGREE_REL and not compared:   # the paths agree; against the textbook, nothing was seen
        return unseen("path_agreement", "the paths agree, but no attention call of theirs was seen to compare "
                                        "against the textbook")
    return row("path_agreement", "fail" if worst > AGREE_REL else "pass", worst, f"<= {AGREE_REL:g}",
               detail, "" if worst <= AGREE_REL else cause)


CHECKS = (
    Check(path_agreement, does="each path the target switches between (transformers' eager/sdpa, this project's "
                                "explicit/sdpa, MHA's need_weights): outputs, plain and padded (real tokens), and each "
                                "call against the textbook attention on its q, k, v",
          fails_when="paths differ or a call differs from the textbook",
          tolerance="1e-5", applies="targets with switchable attention paths",
          thread="huggingface/transformers #48769",
          causes={"call_vs_textbook": "a path's attention call differs from the textbook attention on its own q, k, v",
                  "paths_differ": "the paths' outputs differ"}),
)
