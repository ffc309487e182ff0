"""The styles test bed: small causal LMs written in the manner of public projects (gpt-fast,
torchtune, LitGPT, Meta's Llama, mistral-inference, Megatron-LM, fused-qkv bmm, FlexAttention with a
mask_mod and with a score_mod, einops, nn.TransformerDecoderLayer), each healthy and with the
catalogue's bugs its notation can express, each taken bare from the command line:
`python -m attention_doctor doctor_lab.styles.STYLE:healthy` or `...:BUG`.

One record per bug (`BUGS`: what it is, the checks that must flag it with their documented cause,
where it comes from) and one per (style, bug) (`CASES`: planted, with how, or not, with why the
style's interface cannot express it), as PyTorch's OpInfo has one per operator; the tests and
`measure.py` (today's doctor on every case, BASELINE.md) are derived from them. A style module
says `PLANTED` (bug -> how), `CANNOT` (bug -> why not), optionally `EXPECTS` (bug -> checks,
where its notation moves the bug to another check) and `HAZARDS` (the (check, cause) rows its
faithful healthy model fails: a known hazard of that project's formula), `build(bug=None, seed=0)`, and the bed's own
drivers of its interface: `padded(model, ids, keep)`, `cached(model, ids, n_new)`, `plain(model, ids)`
where its forward needs more than the ids.

The classic four (doctor_styles: nanogpt, einsum, functional, mha_subclass) join with one line,
`CASES += from_classic(classic)`; their targets `classic:STYLE_BUG` need classic.py to give
zero-argument factories by those names (`_common.factories` gives them per module)."""
from dataclasses import dataclass

from doctor_lab.styles import (
    decoder_layer,
    einops_matmul,
    flex_mask,
    flex_score,
    fused_bmm,
    gpt_fast,
    litgpt,
    llama,
    megatron,
    mistral,
    torchtune,
)


@dataclass(frozen=True)
class Bug:
    """A planted bug: `expects`, the (check, cause) rows that must fail (causes: docs/doctor.md's
    tables); `source`, the catalogue experiment (conf/exp) or public thread it reproduces;
    `styles`, the styles it belongs to (empty: every style plants it or says why it cannot)."""
    name: str
    what: str
    expects: tuple[tuple[str, str], ...]
    source: str
    styles: tuple[str, ...] = ()


BUGS = {b.name: b for b in (
    Bug("no_scaling", "q k^T without 1/sqrt(d_k)", (("score_scale", "too_large"),), "no_scaling"),
    Bug("off_by_one", "the diagonal masked: a token cannot see itself", (("self_visibility", "own_key_masked"),),
        "causal_off_by_one"),
    Bug("sees_next", "the diagonal one too far: a token sees the next one", (("future_leak", "outputs_move"),),
        "causal_off_by_one (the other way)"),
    Bug("mask_ignored", "the forward takes a padding mask and ignores it", (("padding", "mask_ignored"),),
        "issue 44 (an ignored mask is never n/a)"),
    Bug("softmax_over_queries", "softmax over the wrong dim (the queries, -2)",
        (("future_leak", "outputs_move"), ("amplified_logits", "row_sum")), "issue 44; the classic bed"),
    Bug("naive_softmax", "exp(s) / sum exp(s), no max subtracted", (("amplified_logits", "nonfinite"),), "naive_softmax"),
    Bug("sum_normalize", "s / sum(s): weights that sum to 1 but go negative", (("amplified_logits", "outside_hull"),),
        "sum_normalize"),
    Bug("no_transpose_merge", "heads merged without the transpose", (("future_leak", "outputs_move"),),
        "head_merge_no_transpose"),
    Bug("neg_inf_fill", "a -inf fill under left padding: a row with no visible key is NaN and spreads",
        (("fully_masked_rows", "nonfinite_outputs"),), "fully_masked_rows; pytorch/pytorch #41508"),
    Bug("cache_top_left", "under a KV cache the causal mask is aligned top-left", (("kv_cache", "new_tokens_differ"),),
        "causal_kv_cache; pytorch/pytorch #108108"),
    Bug("cache_off_by_one", "the cache read off by one", (("kv_cache", "new_tokens_differ"),), "issue 44"),
    Bug("cache_positions_from_zero", "positions counted from zero under a cache", (("kv_cache", "new_tokens_differ"),),
        "issue 44"),
    Bug("finite_mask", "masked scores filled with -10000.0 (Megatron's attention_mask_func)",
        (("amplified_logits", "masked_key_weight"),), "finite_mask_leak", ("megatron",)),
    Bug("packed_sequences_mix", "a packed batch's mask from positions alone: sequences see each other",
        (("batch_independence", "rows_mix"),), "issue 44 (mistral-inference's packed batches)", ("mistral",)),
    Bug("decode_no_offset", "a flex decode step whose mask_mod lacks its offset", (("kv_cache", "new_tokens_differ"),),
        "issue 44; gpt-fast's get_mask_mod(mask_mod, offset)", ("flex_mask",)),
    Bug("blockmask_block_offset", "the mask_mod offset from the block index: wrong where T is not a multiple of the "
        "block size", (("kv_cache", "new_tokens_differ"),), "issue 44; decode masks sliced as block_mask[:, :, "
        "input_pos // BLOCK_SIZE]", ("flex_mask",)),
    Bug("blockmask_reused", "a BlockMask built for one call reused at another length and padding (torch >= 2.6 "
        "raises on the length: the padded and unpadded rows differ in length, so padding sees the raise)",
        (("padding", "target_raised"), ("kv_cache", "target_raised")),
        "issue 44; pytorch/pytorch #141435, meta-pytorch/attention-gym #31", ("flex_mask",)),
)}
CATALOGUE = tuple(name for name, b in BUGS.items() if not b.styles)

STYLES = {m.__name__.rsplit(".", 1)[1]: m for m in (
    gpt_fast, torchtune, litgpt, llama, mistral, megatron, fused_bmm, flex_mask, flex_score, einops_matmul, decoder_layer)}


@dataclass(frozen=True)
class Case:
    """One (style, bug): bug None is the healthy model; `how` it is planted, or `cannot`, why the
    style's interface cannot express it; `expects` the (check, cause) rows that must fail (for the
    healthy model: its style's hazards, and nothing else)."""
    style: str
    bug: str | None
    expects: tuple[tuple[str, str], ...] = ()
    how: str = ""
    cannot: str = ""
    target: str = ""   # the command line's TARGET

    @property
    def planted(self) -> bool:
        return not self.cannot

    @property
    def id(self) -> str:
        return f"{self.style}/{self.bug or 'healthy'}"


def style_cases(name, module) -> list[Case]:
    """The healthy model, then every catalogue bug and the style's own, planted or not."""
    own = getattr(module, "EXPECTS", {})
    out = [Case(name, None, getattr(module, "HAZARDS", ()), how="healthy", target=f"{module.__name__}:healthy")]
    for bug in CATALOGUE + tuple(b for b in module.PLANTED if b not in CATALOGUE):
        if bug in module.PLANTED:
            out.append(Case(name, bug, own.get(bug, BUGS[bug].expects), how=module.PLANTED[bug],
                            target=f"{module.__name__}:{bug}"))
        else:
            out.append(Case(name, bug, cannot=module.CANNOT.get(bug, "")))
    return out


def from_classic(classic) -> list[Case]:
    """The classic bed's cases (a STYLES dict of classes with SUPPORTS, BUGS: bug -> checks) as
    records: a bug's checks without causes (that bed declares none), the healthy model's hazards."""
    return [Case(style, bug, tuple((c, "") for c in classic.BUGS[bug]) if bug else cls.HAZARDS, how=bug or "healthy",
                 target=f"{classic.__name__}:{style}_{bug or 'healthy'}")
            for style, cls in classic.STYLES.items() for bug in (None, *cls.SUPPORTS)]


CASES = [c for name, module in STYLES.items() for c in style_cases(name, module)]


def build(style: str, bug: str | None = None, seed: int = 0):
    return STYLES[style].build(bug, seed)
