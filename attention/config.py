"""The model's and the attention layer's settings: each field once, with its default, what it may
be and what it means. No torch here: experiments.schema builds its `model.*` keys from these fields
(and docs/config.md from those), and a run's config hash drops keys at these defaults, without
loading a model. conf/model/small.yaml holds the same defaults (tests/test_config.py holds them equal).

A field's choices are read from the table that dispatches them (SOFTMAXES in softmax.py, SCORINGS
in scoring.py, MASK_FILLS in masks.py, ...), so a new value in a table is allowed at once; the
names below are the tables of mha.py's and lm.py's own switches.
"""
import math
from dataclasses import dataclass, field, fields
from typing import Callable

SCALES = ("sqrt_dk", "none", "learned")                # the scores' multiplier (or a number)
MERGES = ("correct", "no_transpose")                    # how heads are merged back into d_model
BACKENDS = ("auto", "explicit", "sdpa")                 # auto: the fused kernel wherever it can compute the config
INITS = ("gpt2", "torch_default", "unit_variance")
POSITIONS = ("learned", "rope")                         # absolute learned embeddings | rotary q, k
PAD_POSITIONS = ("from_padding", "from_first_token")    # where a left-padded row's positions start


@dataclass(frozen=True)
class Allowed:
    """What a value may be; `allowed()` says it in words for the one-line error."""
    kind: str                       # int | float | bool | str | list
    lo: float | None = None         # inclusive bounds unless *_open
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    choices: Callable[[], tuple] | tuple | None = None
    null: bool = False              # null allowed (means: derived, as the field's doc says)
    number: bool = False            # with choices: a number in [lo, hi] is allowed as well

    def options(self) -> tuple:
        return tuple(self.choices()) if callable(self.choices) else tuple(self.choices or ())

    def allowed(self) -> str:
        parts = []
        if self.choices is not None:
            parts.append("one of " + ", ".join(map(show, self.options())))
        if self.choices is None or self.number:
            noun = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
                    "list": "a list"}[self.kind if not self.number or self.kind == "int" else "float"]
            parts.append(noun + self._range())
        if self.null:
            parts.append("null")
        return " or ".join(parts)

    def _range(self) -> str:
        lo, hi = self.lo, self.hi
        if lo is not None and hi is not None:
            return f" in {'(' if self.lo_open else '['}{show(lo)}, {show(hi)}{')' if self.hi_open else ']'}"
        if lo is not None:
            return f" {'>' if self.lo_open else '>='} {show(lo)}"
        if hi is not None:
            return f" {'<' if self.hi_open else '<='} {show(hi)}"
        return ""

    def ok(self, v) -> bool:
        if v is None:
            return self.null
        if self.choices is not None and _among(v, self.options()):
            return True
        if self.choices is not None and not self.number:
            return False
        kind = ("int" if self.kind == "int" else "float") if self.number else self.kind
        if kind == "bool":
            return isinstance(v, bool)
        if kind == "str":
            return isinstance(v, str)
        if kind == "list":
            return isinstance(v, list)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind == "int" and not isinstance(v, int)):
            return False
        if not math.isfinite(v):
            return False
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        return not (self.hi is not None and (v >= self.hi if self.hi_open else v > self.hi))


def _among(v, options) -> bool:  # True == 1 in Python: a bool matches only a bool
    return any(v == o and isinstance(v, bool) == isinstance(o, bool) for o in options)


def show(x) -> str:
    """A value as the config writes it: true, 3 (not 3.0), sqrt_dk."""
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


def show_value(v) -> str:
    """A value as an error line quotes it: 'sqrt' for a string, null for None."""
    return repr(v) if isinstance(v, str) else show(v) if v is not None else "null"


def not_allowed(key: str, value, allowed: Allowed) -> str:
    return f"{key}={show_value(value)} is not allowed: {allowed.allowed()}"


POS_INT, NONNEG_INT = Allowed("int", lo=1), Allowed("int", lo=0)
PROB = Allowed("float", lo=0, hi=1, hi_open=True)
POSITIVE_OR_NULL = Allowed("float", lo=0, lo_open=True, null=True)


# -- the choice tables of the modules that implement them (read late: they need torch) -----------
def _softmaxes():
    from attention.softmax import SOFTMAXES
    return tuple(SOFTMAXES)


def _scorings():
    from attention.scoring import SCORINGS
    return tuple(SCORINGS)


def _rope_dtypes():
    from attention.rotary import ROPE_DTYPES
    return tuple(ROPE_DTYPES)


def _masks(name: str):
    def options():
        import attention.masks as masks
        return tuple(getattr(masks, name))
    return options


def setting(default, allowed: Allowed, doc: str, key: str | None):
    """A config field: its default, what it may be, what it means, and its config key (None: set
    by the model, not by the config)."""
    return field(default=default, metadata={"allowed": allowed, "doc": doc, "key": key})


# the fields the LM hands its attention layers from model.* (declared once, used by both classes)
_MODEL_LEVEL = {
    "d_model": (64, POS_INT, "the residual stream's width"),
    "n_heads": (4, POS_INT, "query heads per layer"),
    "n_kv_heads": (None, Allowed("int", lo=1, null=True), "key/value heads: null = n_heads (MHA); a divisor of n_heads (GQA); 1 (MQA)"),
    "bias": (True, Allowed("bool"), "biases in every linear layer and LayerNorm"),
}


def model_level(name: str):
    default, allowed, doc = _MODEL_LEVEL[name]
    return setting(default, allowed, doc, f"model.{name}")


def attention(default, allowed: Allowed, doc: str):
    return field(default=default, metadata={"allowed": allowed, "doc": doc, "key": None})


@dataclass
class AttentionConfig:
    """One attention layer's settings; every failure mode is one value of one field. The field
    names are config keys under model.attention (the first four come from model.*)."""
    d_model: int = model_level("d_model")
    n_heads: int = model_level("n_heads")
    n_kv_heads: int | None = model_level("n_kv_heads")
    d_k: int | None = attention(None, Allowed("int", lo=1, null=True), "per-head width of q and k: null = d_model / n_heads")
    d_v: int | None = attention(None, Allowed("int", lo=1, null=True), "per-head width of v: null = d_k")
    scale: str | float = attention("sqrt_dk", Allowed("str", choices=SCALES, number=True, lo=0, lo_open=True),
                                   "the scores' multiplier: 1/sqrt(d_k), 1 (none), learned per head, or a number")
    softmax: str = attention("stable", Allowed("str", choices=_softmaxes), "scores to weights (attention/softmax.py)")
    score: str = attention("dot", Allowed("str", choices=_scorings), "how queries meet keys (attention/scoring.py)")
    qk_norm: bool = attention(False, Allowed("bool"), "LayerNorm on q and k per head (Wortsman et al. 2023)")
    mask_mode: str = attention("correct", Allowed("str", choices=_masks("MASK_MODES")),
                               "broadcast_bug: a (B, T_k) padding mask added unexpanded")
    mask_fill: str = attention("finite", Allowed("str", choices=_masks("MASK_FILLS")),
                               "what a masked score becomes (attention/masks.py fill_value)")
    merge: str = attention("correct", Allowed("str", choices=MERGES), "no_transpose: heads merged without the transpose")
    backend: str = attention("auto", Allowed("str", choices=BACKENDS),
                             "explicit (scores, softmax, weights @ V) or the fused SDPA kernel")
    dropout: float = attention(0.0, PROB, "dropout on the attention weights")
    bias: bool = model_level("bias")
    softcap: float | None = attention(None, POSITIVE_OR_NULL, "scores -> c tanh(s / c) (Gemma 2: 50)")
    qk_clip: float | None = attention(None, POSITIVE_OR_NULL, "QK-clip's tau: after each step, shrink W_q, W_k of a head whose max logit passed it")
    sigma_reparam: bool = attention(False, Allowed("bool"), "W_hat = gamma / sigma(W) W on W_q, W_k, W_v, W_o (Zhai et al. 2023)")
    rope: bool = field(default=False, metadata={"key": None, "doc": "rotary q, k (set by the LM from model.pos)"})
    rope_dtype: str = attention("float32", Allowed("str", choices=_rope_dtypes), "the precision the rotary phases are computed in")
    causal_align: str = attention("lower_right", Allowed("str", choices=_masks("CAUSAL_ALIGNS")),
                                  "the causal mask's diagonal when T_q != T_k (top_left: SDPA's is_causal)")
    causal: str = attention("correct", Allowed("str", choices=_masks("CAUSALS")), "off_by_one: a token cannot see itself")
    mask_combine: str = attention("logical_and", Allowed("str", choices=_masks("MASK_COMBINES")),
                                  "add_min: causal and padding masks added as finfo.min")
    upcast: bool = attention(False, Allowed("bool"), "scale q first, then q.k and softmax in float32")
    reach: str = attention("all", Allowed("str", choices=_masks("REACHES")),
                           "self: each query attends only to its own key (the no-attention floor)")
    kv_window: int | None = attention(None, Allowed("int", lo=1, null=True),
                                      "evaluation and decoding keep only the last kv_window tokens' keys and values "
                                      "(a sliding-window KV cache; training attends to the whole prefix); null: all")
    kv_sinks: int = attention(0, NONNEG_INT, "the first tokens a sliding-window KV cache keeps as well (attention sinks)")

    def __post_init__(self):
        validate_fields(self)
        if self.d_k is None:
            if self.d_model % self.n_heads:
                raise ValueError(f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads} "
                                 f"(or set model.attention.d_k)")
            self.d_k = self.d_model // self.n_heads
        self.d_v = self.d_k if self.d_v is None else self.d_v
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        elif self.n_heads % self.n_kv_heads:
            raise ValueError(f"model.n_kv_heads={self.n_kv_heads} does not divide model.n_heads={self.n_heads}")
        if self.rope and self.d_k % 2:
            raise ValueError(f"model.pos='rope' needs an even head width: d_k={self.d_k} "
                             f"(model.d_model / model.n_heads or model.attention.d_k)")
        if self.upcast and self.score != "dot":
            raise ValueError(f"model.attention.upcast=true scales q before q.k: score={self.score!r} is not dot")
        if self.backend == "sdpa" and self.sdpa_limits():
            raise ValueError(f"model.attention.backend='sdpa' cannot express {', '.join(self.sdpa_limits())}: "
                             f"use backend=explicit or auto")

    def sdpa_limits(self) -> list[str]:
        """What the fused kernel cannot compute here (empty: it can): a softmax of its own, a score
        it has no dot product for, a replaced -1e4 (SDPA adds masks), the float32 upcast, a soft-cap."""
        from attention.scoring import SCORINGS
        limits = [f"softmax={self.softmax!r}"] if self.softmax != "stable" else []
        limits += [f"score={self.score!r}"] if SCORINGS[self.score].sdpa_q is None else []
        limits += [f"mask_fill={self.mask_fill!r}"] if self.mask_fill == "minus_1e4" else []
        limits += ["upcast=true"] if self.upcast else []
        limits += [f"softcap={show(self.softcap)}"] if self.softcap is not None else []
        return limits

    @property
    def use_sdpa(self) -> bool:
        return self.backend == "sdpa" or (self.backend == "auto" and not self.sdpa_limits())


@dataclass
class ModelConfig:
    """The LM's settings; field names are config keys under model (vocab_size comes from the task)."""
    vocab_size: int = field(default=64, metadata={"key": None, "allowed": Allowed("int", lo=1),
                                                  "doc": "from the task (data.vocab_size)"})
    block_size: int = setting(64, POS_INT, "the longest input (learned positions' table); conf: data.seq_len", "model.block_size")
    d_model: int = model_level("d_model")
    n_layers: int = setting(2, POS_INT, "transformer blocks", "model.n_layers")
    n_heads: int = model_level("n_heads")
    n_kv_heads: int | None = model_level("n_kv_heads")
    d_ff: int | None = setting(None, Allowed("int", lo=1, null=True), "the MLP's width: null = 4 d_model", "model.d_ff")
    dropout: float = setting(0.0, PROB, "residual and MLP dropout (attention's: model.attention.dropout)", "model.dropout")
    bias: bool = model_level("bias")
    tie_weights: bool = setting(True, Allowed("bool"), "the output head shares the token embedding", "model.tie_weights")
    init: str = setting("gpt2", Allowed("str", choices=INITS), "weight init (unit_variance: q, k of variance 1)", "model.init")
    qk_gain: float = setting(1.0, Allowed("float", lo=0, lo_open=True), "multiplies W_q and W_k after init", "model.qk_gain")
    attention: dict = field(default_factory=dict, metadata={"key": None})  # AttentionConfig's fields
    mlp: bool = setting(True, Allowed("bool"), "false: attention-only blocks (Dong et al. 2021)", "model.mlp")
    residual: bool = setting(True, Allowed("bool"), "false: no skip connections around attention and MLP", "model.residual")
    pos: str = setting("learned", Allowed("str", choices=POSITIONS), "positions: absolute learned, or rotary q and k", "model.pos")
    pad_positions: str = setting("from_padding", Allowed("str", choices=PAD_POSITIONS),
                                 "a left-padded row's positions: from the first column, or from its first token", "model.pad_positions")

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown model field(s): {', '.join(unknown)}")
        return cls(**d)

    def __post_init__(self):
        validate_fields(self)
        self.d_ff = 4 * self.d_model if self.d_ff is None else self.d_ff
        self.attention = dict(self.attention)
        self.attn = AttentionConfig(d_model=self.d_model, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
                                    bias=self.bias, rope=self.pos == "rope", **self.attention)


def key_of(cls, f) -> str | None:
    """A field's config key: model.X for ModelConfig's and the model-level ones, model.attention.X else."""
    if "key" not in f.metadata:
        return None
    if f.metadata["key"] is not None:
        return f.metadata["key"]
    return f"model.attention.{f.name}" if cls is AttentionConfig and "allowed" in f.metadata else None


def validate_fields(obj) -> None:
    """Each field against what it may be: ValueError of one line naming its config key."""
    for f in fields(obj):
        allowed = f.metadata.get("allowed")
        if allowed is not None and not allowed.ok(getattr(obj, f.name)):
            raise ValueError(not_allowed(key_of(type(obj), f) or f"model.{f.name}", getattr(obj, f.name), allowed))


def config_fields() -> dict[str, tuple]:
    """{config key: (default, Allowed, doc)} of every model.* and model.attention.* key, in order."""
    out = {}
    for cls in (ModelConfig, AttentionConfig):
        for f in fields(cls):
            key = key_of(cls, f)
            if key is not None and key not in out:
                out[key] = (f.default, f.metadata["allowed"], f.metadata["doc"])
    return out


def defaults() -> dict:
    """The declared defaults as a nested {"model": {..., "attention": {...}}}."""
    model: dict = {"attention": {}}
    for key, (default, _, _) in config_fields().items():
        *path, last = key.split(".")[1:]
        (model["attention"] if path else model)[last] = default
    return {"model": model}
