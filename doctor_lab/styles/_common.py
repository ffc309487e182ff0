"""What the styles share: the tiny size, the catalogue's bugs where their logic is the same in
every notation (the causal mask's diagonal, the normalisation, the head merge, the scale), the
parts around attention (RMSNorm, SwiGLU), rotary tables, and the command line's factories.

Every style is built the same way: seeded, its parameters made in one order whatever the bug (a
healthy twin has the same weights), eval mode. A style module says which bugs it plants
(PLANTED: bug -> how) and which its interface cannot express (CANNOT: bug -> why)."""
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, D, HEADS, KV_HEADS, LAYERS = 16, 32, 4, 2, 2
HEAD_DIM = D // HEADS
MAX_POS = 4160      # the doctor shifts positions by 4096 at T = 16 (long_positions)
MAX_BATCH = 16      # the doctor's largest batch (batch_independence: B = T = 16)


# -- the catalogue's bugs where every notation writes them alike --------------------------------

def causal_keep(t_q, t_k, bug, device, offset=None):
    """(t_q, t_k) bool, True = may attend. Query i sits at position offset + i (default t_k - t_q:
    lower-right aligned, so a cache's new queries see every earlier key); cache_top_left puts it
    at i; off_by_one hides the diagonal, sees_next shows the next key."""
    offset = (t_k - t_q if offset is None else offset) if bug != "cache_top_left" else 0
    shift = {"off_by_one": -1, "sees_next": 1}.get(bug, 0)
    q = torch.arange(t_q, device=device)[:, None] + offset
    return torch.arange(t_k, device=device)[None, :] <= q + shift


def normalise(s, bug, fill_zero=None):
    """Weights from scores over the last dim: softmax (over the queries, dim -2, for
    softmax_over_queries), exp / sum without the max (naive_softmax) or s / sum(s)
    (sum_normalize; fill_zero: the masked entries, set to 0 first as a masked sum would)."""
    if bug == "naive_softmax":
        e = s.exp()
        return e / e.sum(-1, keepdim=True)
    if bug == "sum_normalize":
        s = s if fill_zero is None else s.masked_fill(fill_zero, 0.0)
        return s / s.sum(-1, keepdim=True)
    return F.softmax(s, dim=-2 if bug == "softmax_over_queries" else -1)


def scale(head_dim, bug):
    return 1.0 if bug == "no_scaling" else head_dim ** -0.5


def merge(y, bug):
    """(B, h, T, d) -> (B, T, h d); without the transpose, later positions land in earlier rows."""
    B, h, T, d = y.shape
    return (y if bug == "no_transpose_merge" else y.transpose(1, 2)).reshape(B, T, h * d)


def fill(bug, dtype):
    """The value masked scores get: the dtype's lowest (a row with no visible key stays finite),
    or -inf (neg_inf_fill: such a row's softmax is NaN, pytorch #41508)."""
    return float("-inf") if bug == "neg_inf_fill" else torch.finfo(dtype).min


def first_real(keep, T, device):
    """Absolute positions counted from each row's first real token (B, T), or 0..T-1 without a mask."""
    if keep is None:
        return torch.arange(T, device=device)
    return (keep.long().cumsum(-1) - 1).clamp(min=0)


# -- rotary positions ------------------------------------------------------------------------

def rope_cos_sin(positions, head_dim, base=10000.0):
    """cos, sin (..., head_dim) for positions (...) in float32, the half-rotation (GPT-NeoX) layout."""
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    ph = positions.float()[..., None] * inv
    ph = torch.cat([ph, ph], -1)
    return ph.cos(), ph.sin()


def rotate(x, cos, sin):
    """x (B, h, T, d) by cos, sin (T, d) or (B, T, d)."""
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], -1)
    return (x.float() * cos + turned.float() * sin).to(x.dtype)


def freqs_cis(head_dim, end, base=10000.0):
    """Meta's complex rotary table (end, head_dim / 2): e^(i pos theta)."""
    theta = 1.0 / base ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim)
    return torch.polar(torch.ones(end, head_dim // 2), torch.outer(torch.arange(end).float(), theta))


def rotate_complex(x, fc):
    """x (B, T, h, d) with its pairs as complex numbers, times fc (T, d / 2)."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * fc[None, :, None, :]).flatten(3).type_as(x)


# -- around attention ------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim=D, eps=1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class SwiGLU(nn.Module):
    def __init__(self, dim=D, hidden=2 * D):
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(hidden, dim, bias=False), nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Meta's pre-norm block (Llama, gpt-fast, mistral-inference): x + attention(norm(x), ...), then
    + feed_forward(norm(.)); the arguments after x go to the attention as they come."""
    def __init__(self, attention):
        super().__init__()
        self.attention, self.feed_forward = attention, SwiGLU()
        self.attention_norm, self.ffn_norm = RMSNorm(), RMSNorm()

    def forward(self, x, *args):
        h = x + self.attention(self.attention_norm(x), *args)
        return h + self.feed_forward(self.ffn_norm(h))


class MetaTransformer(nn.Module):
    """The shell of Meta's `Transformer` (Llama, gpt-fast): tok_embeddings, layers of
    TransformerBlock(Attention(bug)), norm, output; each style writes its forward."""
    Attention = None

    def __init__(self, bug=None):
        super().__init__()
        self.bug = bug
        self.tok_embeddings = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(TransformerBlock(self.Attention(bug)) for _ in range(LAYERS))
        self.norm, self.output = RMSNorm(), nn.Linear(D, VOCAB, bias=False)


def separate_projections(attention):
    """Meta's wq, wk, wv (grouped kv heads) and wo on an attention module (Llama, mistral-inference)."""
    attention.wq = nn.Linear(D, HEADS * HEAD_DIM, bias=False)
    attention.wk = nn.Linear(D, KV_HEADS * HEAD_DIM, bias=False)
    attention.wv = nn.Linear(D, KV_HEADS * HEAD_DIM, bias=False)
    attention.wo = nn.Linear(HEADS * HEAD_DIM, D, bias=False)


# -- building, and the command line's factories ----------------------------------------------

def built(make, bug, planted, seed=0):
    """make(bug) seeded and in eval mode; a bug the style does not plant is an error."""
    if bug is not None and bug not in planted:
        raise ValueError(f"this style does not plant {bug!r} (it plants: {', '.join(planted)})")
    torch.manual_seed(seed)
    return make(bug).eval()


def factories(build, planted):
    """A module __getattr__ giving `healthy` and one zero-argument factory per planted bug, so
    that `python -m attention_doctor doctor_lab.styles.STYLE:BUG` builds it."""
    def __getattr__(name):
        if name == "healthy":
            return functools.partial(build, None)
        if name in planted:
            return functools.partial(build, name)
        raise AttributeError(name)
    return __getattr__
