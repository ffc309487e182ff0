"""The generated bed's registries, one record per entry as PyTorch's OpInfo: the axis values a style
is composed of (`AXES`) and the bugs planted into styles (`BUGS`). Which combinations are valid and
what the doctor must say about each are derived from these records alone (`combos.py`), never from a
list of cases. Torch-free.

A value `gives` features (what its construction has: its own softmax, a KV cache, absolute
positions...), `needs` features some other value must give and `excludes` features none may give; a
bug `needs` and `excludes` features the same way. A value may move a bug's expected rows (`moves`:
SDPA's dropout is `sdpa_dropout_p`, not `random_in_eval`) and says which checks its construction makes
n/a (`na`: no KV cache -> kv_cache)."""
from dataclasses import dataclass, field

FAIL, WARN = "fail", "warn"


@dataclass(frozen=True)
class Expect:
    """A row the doctor must give: `check` with `outcome` and one of `causes`."""
    check: str
    causes: frozenset[str]
    outcome: str = FAIL

    def __str__(self) -> str:
        return f"{self.check} {self.outcome} ({'|'.join(sorted(self.causes))})"


def expect(check: str, *causes: str, outcome: str = FAIL) -> Expect:
    return Expect(check, frozenset(causes), outcome)


@dataclass(frozen=True)
class Value:
    """One value of one axis: `what` it is, in the words of the code it builds."""
    axis: str
    name: str
    what: str
    gives: frozenset[str] = frozenset()
    needs: frozenset[str] = frozenset()
    excludes: frozenset[str] = frozenset()
    na: tuple[str, ...] = ()
    moves: dict = field(default_factory=dict)   # bug -> tuple[Expect, ...] that replaces the bug's own

    @property
    def key(self) -> str:
        return f"{self.axis}={self.name}"


def v(axis, name, what, gives=(), needs=(), excludes=(), na=(), moves=None) -> Value:
    return Value(axis, name, what, frozenset(gives), frozenset(needs), frozenset(excludes), tuple(na), moves or {})


@dataclass(frozen=True)
class Bug:
    """A catalogue bug: `expects` the rows it must give (conditional ones in `when`: feature set ->
    more rows, where the construction adds a consequence), `needs`/`excludes` features, `source` the
    catalogue experiment (conf/exp) or thread it reproduces."""
    name: str
    what: str
    expects: tuple[Expect, ...]
    source: str
    needs: frozenset[str] = frozenset()
    excludes: frozenset[str] = frozenset()
    when: tuple[tuple[frozenset[str], tuple[Expect, ...]], ...] = ()
    needs_one_of: tuple[frozenset[str], ...] = ()   # alternatives: one of these feature sets (none: no constraint)
    fit_why: str = ""   # why the fit rules leave out styles it could be written into (no output can show it there)


def b(name, what, expects, source, needs=(), excludes=(), when=(), needs_one_of=(), fit_why="") -> Bug:
    return Bug(name, what, tuple(expects), source, frozenset(needs), frozenset(excludes),
               tuple((frozenset(f), tuple(e)) for f, e in when), tuple(frozenset(f) for f in needs_one_of), fit_why)


OWN = ("own_scores", "own_weights", "dropout_site", "fill")
# nan_rows: a row with every score -inf is NaN (own weights only: SDPA and flex give 0 for it)
SOFTMAX_ROWS = ("softmax_family", "nan_rows", "sum_norm")
NO_WINDOW, ONE_PATH, NO_SAVE = "sliding_window", "path_agreement", "config_roundtrip"
SDPA_DROPOUT = (expect("eval_dropout", "sdpa_dropout_p"),)

AXES_VALUES: tuple[Value, ...] = (
    # score layout and notation: the tensor the weights are computed on
    v("scores", "matmul", "q @ k.transpose(-2, -1), scores (B, H, T_q, T_k)", OWN),
    v("scores", "einsum_bhqk", "einsum('bhqd,bhkd->bhqk'), scores (B, H, T_q, T_k)", OWN),
    v("scores", "einsum_bqhk", "einsum('bqhd,bkhd->bqhk'), scores (B, T_q, H, T_k) (DeepSeek's MLA)", OWN),
    v("scores", "bmm", "torch.bmm over (B*H, T, d), scores (B*H, T_q, T_k)", OWN),
    v("scores", "sdpa", "F.scaled_dot_product_attention with attn_mask (a fully masked row gives 0)",
      ("dropout_site", "fill", "library_softmax"), moves={"dropout_in_eval": SDPA_DROPOUT}),
    v("scores", "flex", "flex_attention with a score_mod (forward only on CPU; a fully masked row gives 0)",
      ("fill", "library_softmax"), excludes=("additive_mask",)),
    # q/k/v layout
    v("qkv", "separate", "wq, wk, wv: H heads each"),
    v("qkv", "fused", "one c_attn split in three"),
    v("qkv", "grouped", "wq of H heads, wkv of H/2 heads repeated (GQA)"),
    v("qkv", "latent", "k and v up-projected from a latent of D/2 (multi-head latent attention, naive path)"),
    # mask encoding
    v("mask", "bool", "a bool keep-mask; masked_fill(~keep, finfo.min)"),
    v("mask", "additive_min", "an additive float mask of 0 / finfo.min", ("additive_mask",)),
    v("mask", "additive_neginf", "an additive float mask of 0 / -inf; a padded query keeps its own key (no "
      "fully masked row)", ("additive_mask", "neginf")),
    v("mask", "tril", "torch.ones(T_q, T_k).tril(diagonal) times the padding; masked_fill(mask == 0, finfo.min)"),
    # where the mask is made
    v("mask_at", "layer", "each attention call builds its mask from the padding and its cache offset"),
    v("mask_at", "model", "the LM builds one (B, 1, T_q, T_k) mask and passes it to every layer"),
    # normalisation
    v("norm", "softmax", "softmax over the keys", ("softmax_family", "nan_rows", "sum_norm")),
    # row_shift_visible: a score added alike to a whole row moves the weights (a softmax cancels it)
    v("norm", "sigmoid", "sigmoid(s - log 16) (sigmoid attention: rows need not sum to 1)", ("row_shift_visible",),
      needs=("own_weights",)),
    v("norm", "sinks", "a learned sink logit per head joins each row's softmax and is dropped (gpt-oss)",
      ("softmax_family", "row_shift_visible", "sink_logit"), needs=("own_weights",)),
    v("norm", "differential", "softmax(q1 k1) - lambda softmax(q2 k2) on half head dims (Diff Transformer)",
      SOFTMAX_ROWS, needs=("own_weights",)),
    # positions
    v("positions", "learned", "an nn.Embedding of absolute positions added to the tokens, counted from the first "
      "real token", ("abs_positions", "position_phases")),
    # position_phases: a query's absolute position enters its scores (ALiBi's -slope (i - j) does not: a
    # query index off by a constant shifts its whole row alike, which only row_shift_visible weights show)
    v("positions", "rope_real", "rotary, half-rotation layout, cos/sin in float32", ("rope", "position_phases")),
    v("positions", "rope_complex", "rotary as a complex64 freqs_cis buffer (Meta's Llama)", ("rope", "position_phases")),
    v("positions", "alibi", "ALiBi: -slope_h (i - j) added to the scores", ("bias",)),
    # cache convention
    v("cache", "none", "no KV cache: forward(input_ids, attention_mask=None, position_ids=None)", na=("kv_cache",)),
    v("cache", "start_pos", "a cache kept inside, grown with zeros, driven by forward(tokens, start_pos=0, "
      "attention_mask=None) (Meta's Llama: no position ids, so a caller cannot correct left padding's positions)",
      ("cache",), moves={"left_pad_positions": (expect("padding", "left_padding"),)}),
    v("cache", "intermediates", "forward(x, ..., cache=None, return_intermediates=False, cache_age=1): the "
      "whole sequence in, its last cache_age tokens computed", ("cache",)),
    v("cache", "presents", "forward(input_ids, ..., past_key_values=None, use_cache=False) -> (logits, presents), "
      "per-layer (k, v)", ("cache",)),
    # init
    v("init", "default", "PyTorch's default init"),
    v("init", "zero_out", "every attention output projection zero at init (nanochat, ReZero)"),
    # size
    v("size", "d32_l2", "d_model 32, 2 heads of 16, 2 layers"),
    v("size", "d64_l1", "d_model 64, 4 heads of 16, 1 layer"),
)
AXES: dict[str, tuple[Value, ...]] = {}
for _val in AXES_VALUES:
    AXES.setdefault(_val.axis, ())
    AXES[_val.axis] += (_val,)
VALUES = {val.key: val for val in AXES_VALUES}
ALWAYS_NA = (NO_WINDOW, ONE_PATH, NO_SAVE)   # the generated LM declares no window, has one path, no save/load

FUTURE = expect("future_leak", "outputs_move", "gradient_nonzero")
BUGS_LIST: tuple[Bug, ...] = (
    b("no_scaling", "q k^T without 1/sqrt(d_k)", [expect("score_scale", "too_large")], "no_scaling"),
    b("cosine_scores", "q and k l2-normalised, no temperature", [expect("score_scale", "too_small")],
      "cosine_no_temperature"),
    b("scale_after", "q k^T before the scale (the scale on the product)", [expect("low_precision", "qk_before_scale")],
      "qk_fp16_overflow", needs=("own_scores",), needs_one_of=[("softmax_family",), ("additive_mask",)],
      fit_why="the product passes float16's 65504 only where the scaled score is beyond +-16000 (a scale of 1/4 "
              "is exact): a softmax turns the +inf into NaN, an additive mask adds its fill to it (finfo.min: a "
              "masked key weighted 1; -inf: NaN), but sigmoid weights are 0 or 1 there anyway and a masked_fill "
              "replaces the masked entries: beside sigmoid and a bool or tril mask no output differs (measured: "
              "0 in float16 with q and k x 1 to x 3000)"),
    b("sees_next", "the causal diagonal one too far: a query sees the next key", [FUTURE],
      "causal_off_by_one (the other way)"),
    b("no_causal_mask", "no causal mask at all", [FUTURE], "no_causal_mask"),
    b("off_by_one", "the diagonal masked: a query cannot see itself", [expect("self_visibility", "own_key_masked")],
      "causal_off_by_one", when=[(("neginf", "nan_rows", "own_weights"), [expect("finite_output", "nonfinite_output")])]),
    b("softmax_over_queries", "the softmax over the queries' axis",
      [FUTURE, expect("amplified_logits", "row_sum", "future_leak")], "issue 44", needs=("own_weights", "softmax_family")),
    b("naive_softmax", "exp(s) / sum exp(s), no max subtracted", [expect("amplified_logits", "nonfinite")],
      "naive_softmax", needs=("own_weights", "softmax_family")),
    b("sum_normalize", "s / sum(s) on the masked scores (masked set to 0)", [expect("amplified_logits", "outside_hull")],
      "sum_normalize", needs=("own_weights", "sum_norm")),
    b("no_transpose_merge", "heads merged (B, H, T, d) -> (B, T, H d) without the transpose", [FUTURE],
      "head_merge_no_transpose"),
    b("neg_inf_fill", "masked scores -inf with no own-key rescue: a left-padded query with no visible key is NaN",
      [expect("fully_masked_rows", "nonfinite_outputs", "nonfinite_gradients")], "fully_masked_rows; pytorch/pytorch #41508",
      needs=("nan_rows", "own_weights")),
    b("finite_mask", "masked scores filled with -1e4 (Megatron's attention_mask_func)",
      [expect("amplified_logits", "masked_key_weight")], "finite_mask_leak", needs=("softmax_family",),
      excludes=("sink_logit",),
      fit_why="a fill shows only in a row whose visible scores all fall below it; beside a sink logit (zero at "
              "init, not a product of q and k) the sink takes such a row and a masked key's weight stays "
              "exp(-1e4 - sink) = 0: no output can show it (measured: 0 in float32 with q and k x 1 to x 3000)"),
    b("mask_ignored", "the forward takes attention_mask and ignores it", [expect("padding", "mask_ignored")], "issue 44"),
    b("unexpanded_mask", "the (B, T) padding mask combined with the (T, T) causal one without its query axis",
      [expect("batch_independence", "padding_mask_broadcast")], "mask_broadcast"),
    b("left_pad_positions", "absolute positions counted from the first column, not the first real token",
      [expect("padding", "positions_from_padding", outcome=WARN)], "left_padding_positions",
      needs=("abs_positions",)),
    b("cache_top_left", "under a KV cache the causal mask aligned top-left", [expect("kv_cache", "new_tokens_differ")],
      "causal_kv_cache; pytorch/pytorch #108108", needs=("cache",)),
    b("cache_off_by_one", "the cached keys and values read one slot late", [expect("kv_cache", "new_tokens_differ")],
      "issue 44", needs=("cache",)),
    b("cache_positions_from_zero", "the new tokens' positions counted from 0 under a cache",
      [expect("kv_cache", "new_tokens_differ")], "issue 44", needs=("cache",),
      needs_one_of=[("position_phases",), ("bias", "row_shift_visible")],
      fit_why="ALiBi's query index off by the cache length adds slope x length to a whole row alike, which a "
              "softmax cancels: it shows only through positions that enter the scores or beside weights that see "
              "a row's shift (sigmoid, a sink)"),
    b("dropout_in_eval", "attention dropout on in eval", [expect("eval_dropout", "random_in_eval")],
      "meta-pytorch/torchtune #1791", needs=("dropout_site",)),
    b("rope_bf16", "rotary phases computed in bfloat16", [expect("long_positions", "bfloat16_error_grows", "shift_moves_outputs")],
      "rope_low_precision", needs=("rope",)),
)
BUGS: dict[str, Bug] = {bug.name: bug for bug in BUGS_LIST}
