"""The doctor's test bed: attention written in four styles this project does not use, each a small
causal LM with one switch per catalogue bug a forward check can see. Written here from the
catalogue's descriptions (conf/exp/*.yaml), not copied from any library; the interfaces follow
conventions people use (a forward that returns the last position's logits unless given targets,
masks named `mask` / `attention_mask`, positions by `pos` / `start_pos`, a cache kept inside or
passed back in), so that the doctor meets them without an adapter.

    nanogpt      matmul + F.softmax, a fused c_attn, the scale after q k^T; forward(idx, targets=None,
                 attention_mask=None) returns the last position's logits unless given targets;
                 learned positions counted from the first real token
    einsum       torch.einsum + a hand-made softmax (max subtracted, exp, divided by the sum), q scaled
                 before the product, q and k|v from to_q / to_kv; rotary positions `pos`; a bool keep
                 `mask`; a KV cache object passed back in (`cache=`, `return_intermediates=True`)
    functional   a module-level attention function called inside the block's forward (no attention
                 module), q|k|v of grouped heads from one projection, Tensor.softmax; an additive
                 `mask`; rotary positions and a KV cache kept inside, both driven by `start_pos`
    mha_subclass a subclass of nn.MultiheadAttention given a causal attn_mask and the padding as
                 key_padding_mask; a bool `attention_mask`; learned positions

BUGS: bug -> the checks that must flag it; STYLES[name].SUPPORTS: the bugs its notation can express.
mask_min_overflow (two finfo.min masks added) is left out: it turns a row non-finite only where every
score it keeps is below -16 in float16, which no input at init gives (the project's own LM shows it
only beside qk_fp16_overflow's scale-after order, the evidence's control note).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, D, HEADS, KV_HEADS, LAYERS, MAX_POS, MAX_BATCH = 16, 32, 4, 2, 2, 4160, 16
P_DROP = 0.1

BUGS = {
    "no_scaling": ("score_scale",),                     # no_scaling: q k^T without 1/sqrt(d_k)
    "cosine_scores": ("score_scale",),                  # cosine_no_temperature
    "naive_softmax": ("amplified_logits",),             # exp(s) / sum exp(s): no max subtracted
    "sum_normalize": ("amplified_logits",),             # s / sum(s)
    "finite_mask": ("amplified_logits",),               # finite_mask_leak: -1e4 added to masked scores
    "no_transpose_merge": ("future_leak",),             # head_merge_no_transpose
    "softmax_over_queries": ("future_leak",),           # normalised over the queries (dim -2)
    "no_causal_mask": ("future_leak",),
    "off_by_one": ("self_visibility",),                 # causal_off_by_one
    "unexpanded_mask": ("batch_independence", "padding"),  # mask_broadcast (B == T), _shape_error (B != T)
    "neg_inf_fill": ("fully_masked_rows",),             # fully_masked_rows
    "cache_top_left": ("kv_cache",),                    # causal_kv_cache
    "scale_after": ("low_precision",),                  # qk_fp16_overflow: q k^T before the scale
    "rope_bf16": ("long_positions",),                   # rope_low_precision
    "left_pad_positions": ("padding",),                 # left_padding_positions (a warn)
    "dropout_in_eval": ("eval_dropout",),
}
WARNS = {"left_pad_positions",   # passes with position ids from the mask: the doctor warns
         # these two put the caller's mask into the scores as given: a (B, 1, 1, T) or (B, 1, T, T) mask
         # masks the batch right, the (B, T) one that masks one row mixes rows at B == T; the doctor finds
         # the encoding on a batch of two and warns that the one-row shape is batch-only (a mask fixed by
         # its shape alone is the caller's contract, as lingua's SDPA attn_mask: not a fail)
         ("einsum", "unexpanded_mask"), ("functional", "unexpanded_mask")}


def warns(style, bug) -> bool:
    """The doctor's expected outcome for (style, bug) on its target checks is a warn, not a fail."""
    return bug in WARNS or (style, bug) in WARNS


# -- the catalogue's bugs, one helper each ------------------------------------------------------

def causal_keep(t_q, t_k, bug, device):
    """(T_q, T_k) bool, True = may attend: lower-right aligned, so a cache's new queries see every
    earlier key (top-left: causal_kv_cache; the diagonal hidden: causal_off_by_one)."""
    if bug == "no_causal_mask":
        return torch.ones(t_q, t_k, dtype=torch.bool, device=device)
    diag = 0 if bug == "cache_top_left" else t_k - t_q - (bug == "off_by_one")
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diag)


def masked(s, causal, pad, bug):
    """Scores with the masked ones filled (healthy: finfo.min, so a row with no visible key stays
    finite). pad: (B, T_k) bool keep-mask or None."""
    keep = causal if pad is None else causal & (pad if bug == "unexpanded_mask" else pad[:, None, None, :])
    if bug == "sum_normalize":
        return s.masked_fill(~keep, 0.0)
    if bug == "finite_mask":
        return s - 1e4 * (~keep).to(s.dtype)
    return s.masked_fill(~keep, float("-inf") if bug == "neg_inf_fill" else torch.finfo(s.dtype).min)


def normalise(s, bug, softmax):
    """Weights from scores: the style's softmax(s, dim), or the catalogue's wrong normalisations."""
    if bug == "naive_softmax":
        e = s.exp()
        return e / e.sum(-1, keepdim=True)
    if bug == "sum_normalize":
        return s / s.sum(-1, keepdim=True)
    return softmax(s, -2 if bug == "softmax_over_queries" else -1)


def scale(d, bug):
    return 1.0 if bug in ("no_scaling", "cosine_scores") else d ** -0.5


def cosine(q, k, bug):
    return (F.normalize(q, dim=-1), F.normalize(k, dim=-1)) if bug == "cosine_scores" else (q, k)


def dropout(w, bug, training):
    return F.dropout(w, P_DROP, training=training or bug == "dropout_in_eval")


def merge(y, bug):
    """(B, h, T, d) -> (B, T, h d); without the transpose, later positions land in earlier rows."""
    B, h, T, d = y.shape
    return (y if bug == "no_transpose_merge" else y.transpose(1, 2)).reshape(B, T, h * d)


def rope(t, pos, bug):
    """Rotary positions on t (B, h, T, d); pos (T,) or (B, T); phases in float32 (bfloat16: the bug)."""
    half = t.shape[-1] // 2
    dt = torch.bfloat16 if bug == "rope_bf16" else torch.float32
    inv = 1.0 / 10000 ** (torch.arange(half, device=t.device, dtype=torch.float32) / half)
    ph = (pos.to(dt)[..., None] * inv.to(dt)).float()          # (.., T, half)
    ph = ph[:, None] if ph.dim() == 3 else ph
    a, b = t[..., :half].float(), t[..., half:].float()
    return torch.cat([a * ph.cos() - b * ph.sin(), a * ph.sin() + b * ph.cos()], -1).to(t.dtype)


def first_real(pad, T, bug, device):
    """Absolute positions (B, T) or (T,): counted from each row's first real token (left padding
    then scores the real tokens at 0..), or from the first column (left_padding_positions)."""
    if pad is None or bug == "left_pad_positions":
        return torch.arange(T, device=device)
    return (pad.long().cumsum(-1) - 1).clamp(min=0)


def heads(t, n):
    B, T, _ = t.shape
    return t.view(B, T, n, -1).transpose(1, 2)


class MLP(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))


# the (check, cause) rows a style's healthy model fails by its formula (styles/__init__.py's HAZARDS):
# q k^T formed before the 1/sqrt(d_k), as nanoGPT writes it, passes float16's 65504 first
SCALE_AFTER_HAZARD = (("low_precision", "qk_before_scale"),)


class LM(nn.Module):
    """Token embedding, LAYERS blocks of pre-norm attention + MLP, a final norm and the head.
    Subclasses make `attn` and say how the forward is called."""
    SUPPORTS = ()
    HAZARDS = ()

    def __init__(self, bug=None, positions=False):
        super().__init__()
        assert bug is None or bug in self.SUPPORTS, f"{type(self).__name__} cannot express {bug}"
        self.bug = bug
        self.tok = nn.Embedding(VOCAB, D)
        self.pos_table = nn.Embedding(MAX_POS, D) if positions else None
        self.ln1 = nn.ModuleList(nn.LayerNorm(D) for _ in range(LAYERS))
        self.attn = nn.ModuleList(self.make_attention() for _ in range(LAYERS))
        self.ln2 = nn.ModuleList(nn.LayerNorm(D) for _ in range(LAYERS))
        self.mlp = nn.ModuleList(MLP() for _ in range(LAYERS))
        self.ln_f, self.head = nn.LayerNorm(D), nn.Linear(D, VOCAB)

    def make_attention(self):
        raise NotImplementedError

    def trunk(self, h, *args):
        for ln1, attn, ln2, mlp in zip(self.ln1, self.attn, self.ln2, self.mlp):
            h = h + attn(ln1(h), *args)
            h = h + mlp(ln2(h))
        return self.head(self.ln_f(h))


# -- nanoGPT style ---------------------------------------------------------------------------

class NanoAttention(nn.Module):
    def __init__(self, bug):
        super().__init__()
        self.bug, self.n_head = bug, HEADS
        self.c_attn, self.c_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x, pad=None):
        B, T, C = x.size()
        q, k, v = (heads(t, self.n_head) for t in self.c_attn(x).split(C, dim=2))
        q, k = cosine(q, k, self.bug)
        att = (q @ k.transpose(-2, -1)) * scale(k.size(-1), self.bug)
        att = masked(att, causal_keep(T, T, self.bug, x.device), pad, self.bug)
        att = dropout(normalise(att, self.bug, F.softmax), self.bug, self.training)
        return self.c_proj(merge(att @ v, self.bug))


class NanoLM(LM):
    HAZARDS = SCALE_AFTER_HAZARD
    SUPPORTS = ("no_scaling", "cosine_scores", "naive_softmax", "sum_normalize", "finite_mask", "no_transpose_merge",
                "softmax_over_queries", "no_causal_mask", "off_by_one", "unexpanded_mask", "neg_inf_fill",
                "left_pad_positions", "dropout_in_eval")

    def __init__(self, bug=None):
        super().__init__(bug, positions=True)

    def make_attention(self):
        return NanoAttention(self.bug)

    def forward(self, idx, targets=None, attention_mask=None):
        pad = None if attention_mask is None else attention_mask.bool()
        h = self.tok(idx) + self.pos_table(first_real(pad, idx.shape[1], self.bug, idx.device))
        logits = self.trunk(h, pad)
        if targets is None:   # inference: the last position only
            return logits[:, [-1], :], None
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


# -- einsum + a hand-made softmax ------------------------------------------------------------

def handmade_softmax(s, dim):
    s = s - s.amax(dim, keepdim=True).detach()
    e = s.exp()
    return e / e.sum(dim, keepdim=True)


class EinsumAttention(nn.Module):
    def __init__(self, bug):
        super().__init__()
        self.bug, self.heads = bug, HEADS
        self.to_q, self.to_kv, self.to_out = nn.Linear(D, D, bias=False), nn.Linear(D, 2 * D, bias=False), nn.Linear(D, D)

    def forward(self, x, pos=None, pad=None, cache=None):
        """cache: this layer's (k, v) so far or None; returns (output, (k, v) with x's appended)."""
        pos = torch.arange(x.shape[1], device=x.device) if pos is None else pos
        q = rope(heads(self.to_q(x), self.heads), pos, self.bug)
        k, v = (heads(t, self.heads) for t in self.to_kv(x).chunk(2, dim=-1))
        k = rope(k, pos, self.bug)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        kept = (k, v)
        q, k = cosine(q, k, self.bug)
        s = scale(q.shape[-1], self.bug)
        sim = torch.einsum("b h i d, b h j d -> b h i j", q if self.bug == "scale_after" else q * s, k)
        if self.bug == "scale_after":
            sim = sim * s
        sim = masked(sim, causal_keep(q.shape[2], k.shape[2], self.bug, x.device), pad, self.bug)
        attn = dropout(normalise(sim, self.bug, handmade_softmax), self.bug, self.training)
        out = torch.einsum("b h i j, b h j d -> b h i d", attn, v)
        return self.to_out(merge(out, self.bug)), kept


class EinsumLM(LM):
    SUPPORTS = ("no_scaling", "cosine_scores", "naive_softmax", "sum_normalize", "finite_mask", "no_transpose_merge",
                "softmax_over_queries", "no_causal_mask", "off_by_one", "unexpanded_mask", "neg_inf_fill",
                "cache_top_left", "scale_after", "rope_bf16", "dropout_in_eval")

    def make_attention(self):
        return EinsumAttention(self.bug)

    def forward(self, x, mask=None, pos=None, cache=None, return_intermediates=False, cache_age=1):
        """x: the whole sequence; with a cache (the intermediates a previous call returned) only its
        last `cache_age` tokens are computed."""
        T = x.shape[1]
        pos = torch.arange(T, device=x.device) if pos is None else pos
        if cache is not None:
            assert mask is None, "a cache takes no padding mask"
            x, pos = x[:, -cache_age:], pos[..., -cache_age:]
        h, new = self.tok(x), []
        for i, (ln1, attn, ln2, mlp) in enumerate(zip(self.ln1, self.attn, self.ln2, self.mlp)):
            a, kv = attn(ln1(h), pos, mask, None if cache is None else cache[i])
            new.append(kv)
            h = h + a
            h = h + mlp(ln2(h))
        logits = self.head(self.ln_f(h))
        return (logits, new) if return_intermediates else logits


# -- a function inside the block's forward ---------------------------------------------------

def attention(q, k, v, keep_pad, bug, training):
    """Scaled dot-product attention as a function: Tensor.softmax, the scale after q k^T."""
    s = torch.matmul(q, k.transpose(2, 3)) * scale(q.shape[-1], bug)
    s = masked(s, causal_keep(q.shape[2], k.shape[2], bug, q.device), keep_pad, bug)
    w = dropout(normalise(s, bug, lambda t, dim: t.softmax(dim=dim)), bug, training)
    return torch.matmul(w, v)


class Block(nn.Module):
    """The projections live on the block; the attention is the function above. A KV cache of
    MAX_BATCH x MAX_POS kept inside, written at start_pos."""
    def __init__(self, bug):
        super().__init__()
        self.bug, self.hd = bug, D // HEADS
        self.norm1, self.norm2, self.mlp = nn.LayerNorm(D), nn.LayerNorm(D), MLP()
        self.in_proj_qkv = nn.Linear(D, (HEADS + 2 * KV_HEADS) * self.hd, bias=False)
        self.out = nn.Linear(D, D, bias=False)
        self.cache_k = torch.zeros(MAX_BATCH, KV_HEADS, MAX_POS, self.hd)
        self.cache_v = torch.zeros(MAX_BATCH, KV_HEADS, MAX_POS, self.hd)

    def forward(self, x, start_pos=0, keep_pad=None):
        B, T, _ = x.shape
        q, k, v = self.in_proj_qkv(self.norm1(x)).split([HEADS * self.hd, KV_HEADS * self.hd, KV_HEADS * self.hd], -1)
        pos = torch.arange(start_pos, start_pos + T, device=x.device)
        q, k, v = rope(heads(q, HEADS), pos, self.bug), rope(heads(k, KV_HEADS), pos, self.bug), heads(v, KV_HEADS)
        self.cache_k, self.cache_v = self.cache_k.to(k), self.cache_v.to(v)
        self.cache_k[:B, :, start_pos:start_pos + T] = k
        self.cache_v[:B, :, start_pos:start_pos + T] = v
        group = HEADS // KV_HEADS
        keys = self.cache_k[:B, :, :start_pos + T].repeat_interleave(group, 1)
        values = self.cache_v[:B, :, :start_pos + T].repeat_interleave(group, 1)
        x = x + self.out(merge(attention(q, keys, values, keep_pad, self.bug, self.training), self.bug))
        return x + self.mlp(self.norm2(x))


class FunctionalLM(nn.Module):
    HAZARDS = SCALE_AFTER_HAZARD
    SUPPORTS = ("no_scaling", "cosine_scores", "naive_softmax", "sum_normalize", "finite_mask", "no_transpose_merge",
                "softmax_over_queries", "no_causal_mask", "off_by_one", "unexpanded_mask", "neg_inf_fill",
                "cache_top_left", "rope_bf16", "dropout_in_eval")

    def __init__(self, bug=None):
        super().__init__()
        assert bug is None or bug in self.SUPPORTS, f"FunctionalLM cannot express {bug}"
        self.tok = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(Block(bug) for _ in range(LAYERS))
        self.norm, self.output = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)

    def forward(self, tokens, start_pos=0, mask=None):
        """mask: (B, T) additive, 0 on real tokens and -inf on padding."""
        keep_pad = None if mask is None else mask > -1
        h = self.tok(tokens)
        for layer in self.layers:
            h = layer(h, start_pos, keep_pad)
        return self.output(self.norm(h))


# -- a subclass of nn.MultiheadAttention -----------------------------------------------------

class CausalSelfMHA(nn.MultiheadAttention):
    def __init__(self, bug):
        super().__init__(D, HEADS, dropout=P_DROP, batch_first=True)
        self.bug = bug

    def forward(self, x, pad=None):
        T, bug = x.shape[1], self.bug
        hide = ~causal_keep(T, T, bug, x.device)      # nn.MultiheadAttention's masks: True = may not attend
        ignore = None if pad is None else ~pad
        if bug == "unexpanded_mask" and pad is not None:
            hide, ignore = hide | ignore, None         # (B, T) taken as the (T, T) attn_mask when B == T
        elif pad is not None:   # one (B h, T, T) mask; a padding token's query sees itself (no row fully masked)
            hide = hide | ignore[:, None, :]
            if bug != "neg_inf_fill":
                hide = hide & ~(torch.eye(T, dtype=torch.bool, device=x.device) & ignore[:, :, None])
            hide, ignore = hide.repeat_interleave(self.num_heads, 0), None
        if bug == "finite_mask":
            hide = hide.float() * -1e4
        query = x * math.sqrt(self.head_dim) if bug == "no_scaling" else x   # cancels the 1/sqrt(d_k)
        y, _ = super().forward(query, x, x, attn_mask=hide, key_padding_mask=ignore,
                               need_weights=bug == "neg_inf_fill")   # need_weights=True: NaN rows (pytorch #41508)
        return F.dropout(y, P_DROP, training=True) if bug == "dropout_in_eval" else y


class MHASubclassLM(LM):
    SUPPORTS = ("no_scaling", "finite_mask", "no_causal_mask", "off_by_one", "unexpanded_mask", "neg_inf_fill",
                "left_pad_positions", "dropout_in_eval")

    def __init__(self, bug=None):
        super().__init__(bug, positions=True)

    def make_attention(self):
        return CausalSelfMHA(self.bug)

    def forward(self, input_ids, attention_mask=None):
        pad = attention_mask
        h = self.tok(input_ids) + self.pos_table(first_real(pad, input_ids.shape[1], self.bug, input_ids.device))
        return self.trunk(h, pad)


STYLES = {"nanogpt": NanoLM, "einsum": EinsumLM, "functional": FunctionalLM, "mha_subclass": MHASubclassLM}


def build(style: str, bug: str | None = None, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return STYLES[style](bug).eval()


def cases():
    """(style, bug) for every style, healthy (bug None) first."""
    return [(s, b) for s, cls in STYLES.items() for b in (None,) + tuple(cls.SUPPORTS)]
