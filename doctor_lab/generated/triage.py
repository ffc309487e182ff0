"""Why each miss of the generated bed happened, after looking: one record per reason, the doctor's
or the construction's, matched on the combination (its style's values, its bug) and the row the
doctor gave. The first record that matches a miss is its reason; a miss none matches is
`untriaged`, shown as such. Torch-free."""
from collections.abc import Callable
from dataclasses import dataclass

from doctor_lab.generated.combos import Combo, Style, bug_fits, valid
from doctor_lab.generated.records import AXES

DOCTOR, CONSTRUCTION = "doctor", "construction"


@dataclass(frozen=True)
class Reason:
    name: str
    whose: str          # DOCTOR or CONSTRUCTION
    what: str           # which check, what it measured, why
    matches: Callable[[Combo, dict], bool]   # (the combination, its miss {kind, check, got})
    twin: tuple[tuple[str, str], ...] = ()   # axis values that remove what it blames: its twin must be right


def twin_of(combo: Combo, reason: "Reason") -> Combo | None:
    """The combination with the reason's twin values swapped in; None where it has none, or where the
    swap is invalid or the bug does not fit it (or nothing changes)."""
    if not reason.twin:
        return None
    names = {v.axis: v.name for v in combo.style.values} | dict(reason.twin)
    style = Style.parse(",".join(names[a] for a in AXES))
    if style == combo.style or not valid(style) or not bug_fits(style, combo.bug):
        return None
    return Combo(style, combo.bug)


UNSEEN = ("inconclusive (scores_unseen)", "inconclusive (no_qk_layout)", "inconclusive (not_amplified)")


def _got(*texts):
    return lambda m: any(m["got"].startswith(t) for t in texts)


REASONS: tuple[Reason, ...] = (
    Reason("ruled_out_since", CONSTRUCTION,
           "a pair the records now leave out, examined before its fit rule: no output can show the bug in that "
           "style (the bug record's fit_why says why: docs/doctor.md's bugs table, `why not elsewhere`)",
           lambda c, m: not (valid(c.style) and bug_fits(c.style, c.bug))),
    Reason("presents_cache_unreachable", DOCTOR,
           "kv_cache inconclusive (unreachable): a forward(..., past_key_values=None, use_cache=False) returning "
           "(logits, presents) outside transformers is not driven bare (issue 61 item 5, on another branch)",
           lambda c, m: c.style["cache"] == "presents" and m["check"] == "kv_cache" and _got("inconclusive")(m),
           twin=(("cache", "intermediates"),)),
    Reason("insensitive_outputs", DOCTOR,
           "output projections zero at init: the attention cannot move the outputs, and the doctor reads that as "
           "no effect instead of perturbing the zero weights in its copy or saying inconclusive (issue 61 item 4): "
           "the mask-encoding search finds the mask ignored (padding fails mask_ignored, fully_masked_rows "
           "unreachable), start_pos is taken for positions only (kv_cache n/a), long_positions passes (and "
           "flex's hidden diagonal passes self_visibility)",
           lambda c, m: c.style["init"] == "zero_out" and m["kind"] in ("missed", "other_cause", "false_alarm")
           and (m["check"] in ("padding", "fully_masked_rows", "kv_cache", "long_positions", "low_precision",
                                "self_visibility")
                or "mask_ignored" in m["got"]) and not _got(*UNSEEN)(m),
           twin=(("init", "default"),)),
    Reason("differential_scale", DOCTOR,
           "score_scale too_small on a healthy differential attention (two maps, each on half the head dims with "
           "its own 1/sqrt(d/2)): per layer the first map's score std reads about 1 and the second's about 0.3 "
           "(1.08, 0.311, 1.01, 0.352 on matmul,grouped,bool,layer,differential,learned,start_pos,zero_out,d32_l2), "
           "though the two are built alike",
           lambda c, m: c.bug == "healthy" and c.style["norm"] == "differential" and m["check"] == "score_scale",
           twin=(("norm", "softmax"),)),
    Reason("not_repeatable_before_na", DOCTOR,
           "dropout left on in eval: config_roundtrip is inconclusive (not_repeatable) where its interface does not "
           "exist (no save/load: n/a), while sliding_window and path_agreement say n/a",
           lambda c, m: m["kind"] == "not_na" and _got("inconclusive (not_repeatable)")(m)),
    Reason("finite_fill_not_reached", DOCTOR,
           "amplified_logits passes a masked_fill(-1e4): the fill replaces the score, so a masked key takes weight "
           "only in a row whose visible scores all fall below -1e4; the amplification (q and k scaled up to scores "
           "of 3e4) made none (an additive -1e4, which moves with the score, is caught)",
           lambda c, m: c.bug == "finite_mask" and m["check"] == "amplified_logits" and _got("pass")(m),
           twin=(("mask", "additive_min"),)),
    Reason("layout_unseen", DOCTOR,
           "scores laid out (B, T_q, H, T_k) (einsum 'bqhd,bkhd->bqhk'): the doctor does not find the scores "
           "(scores_unseen / no_qk_layout) or cannot amplify them (not_amplified), so the checks that read them "
           "are inconclusive (issue 61 item 2)",
           lambda c, m: c.style["scores"] == "einsum_bqhk" and _got(*UNSEEN)(m),
           twin=(("scores", "einsum_bhqk"),)),
    Reason("combined_weights_unseen", DOCTOR,
           "weights that are not one softmax over the keys (a sink column joined then dropped, two maps subtracted "
           "on index-selected halves of the head dims, a sigmoid): the doctor does not read them as attention "
           "weights (scores_unseen), or not the calls' q, k, v (low_precision part_not_run), so a bug inside them "
           "is inconclusive, not a fail",
           lambda c, m: c.style["norm"] in ("sinks", "differential", "sigmoid")
           and _got(*UNSEEN, "inconclusive (part_not_run)")(m),
           twin=(("norm", "softmax"),)),
    Reason("learned_positions_through_start_pos", DOCTOR,
           "long_positions fails (shift_moves_outputs) a healthy model with learned absolute positions driven by "
           "start_pos: through the cache the doctor compares the new tokens' scores among themselves at +4096 "
           "against +0, which absolute positions move by design (without a cache it finds them absolute and passes)",
           lambda c, m: c.bug == "healthy" and c.style["positions"] == "learned" and c.style["cache"] == "start_pos"
           and m["check"] == "long_positions",
           twin=(("cache", "intermediates"),)),
    Reason("rope_bf16_read_as_absolute", DOCTOR,
           "long_positions passes rotary phases computed in bfloat16: the phase error already moves the float32 "
           "outputs at +16, which the doctor takes for absolute positions (no shift invariance to test); its "
           "bfloat16 half then compares against a float64 reference that has the same phase error",
           lambda c, m: c.bug == "rope_bf16" and m["check"] == "long_positions" and _got("pass")(m)),
    Reason("cosine_with_alibi", DOCTOR,
           "score_scale passes cosine scores without a temperature beside ALiBi: the std it reads (about 0.75) is "
           "not the cosine's 1/sqrt(d_k) = 0.25 (the bias's part is not separated from q . k)",
           lambda c, m: c.bug == "cosine_scores" and c.style["positions"] == "alibi" and _got("pass")(m),
           twin=(("positions", "rope_real"),)),
    Reason("scale_after_named_scores_overflow", DOCTOR,
           "low_precision fails q k^T before the scale but names it scores_overflow: where it does not read the "
           "product before the scale as its own site (scores laid out (B, T_q, H, T_k), differential maps), the "
           "overflow is attributed to the scores",
           lambda c, m: c.bug == "scale_after" and _got("fail (scores_overflow)")(m),
           twin=(("scores", "einsum_bhqk"), ("norm", "softmax"))),
    Reason("flex_bf16_scores_nonfinite", DOCTOR,
           "long_positions fails (bfloat16_nonfinite) flex_attention through a start_pos cache: the model's own "
           "bfloat16 outputs at +4096 are finite (checked by hand: largest |logit| 1.84, as at +0); what the doctor "
           "reads as not finite is inside flex's scores (the masked entries' fill), not an output",
           lambda c, m: c.style["scores"] == "flex" and m["check"] == "long_positions"
           and _got("fail (bfloat16_nonfinite)")(m),
           twin=(("scores", "sdpa"),)),
)


def reason_of(combo: Combo, miss: dict) -> Reason | None:
    return next((r for r in REASONS if r.matches(combo, miss)), None)
