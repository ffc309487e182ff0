"""Config round trip: the target saved and loaded back (an Adapter's reloaded(): transformers'
save_pretrained then from_pretrained, into a temporary directory, no download) computes what it
computed before, plain and left-padded: the same weights under the configuration it wrote."""
from attention_doctor.checks.common import AGREE_REL, judged, rel
from attention_doctor.signals import TargetRaised, Unsupported


def config_roundtrip(ctx):
    a = ctx.adapter
    with a.reloaded() as b:   # Unsupported (n/a) where the target has no save and load: decided first
        ctx.require_repeatable()
        agree = ctx.limit(AGREE_REL)   # the target's own rounding noise, where it keeps some
        x = ctx.sample(k=80)
        plain = rel(ctx.run(x, adapter=b), ctx.run(x), "the outputs before saving")
        padded = None
        xp, m = ctx.left_padded(k=81)
        try:
            before = ctx.run(xp, m)[m]
        except Unsupported:   # no padding mask: the plain batch alone
            pass
        except TargetRaised:  # the padded batch raises before saving: padding's failure, not this check's
            pass
        else:   # raising only once reloaded is this check's fail (TargetRaised)
            padded = rel(ctx.run(xp, m, adapter=b)[m], before, "the padded outputs before saving")
    worst = max(plain, padded or 0.0)
    detail = (f"reloaded against before saving, relative difference: plain {plain:.3g}"
              + ("" if padded is None else f", left-padded (real tokens) {padded:.3g}"))
    return judged(worst > agree, worst, f"<= {agree:g}", detail, "reload_differs",
                  plain=plain, padded=padded, limit=agree)
