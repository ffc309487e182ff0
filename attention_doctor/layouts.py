"""Where a target's attention is: its attention modules and, in each, where q and k come out
(the "sites" the doctor scales to amplify scores or to make q and k unit-variance).

A small registry of known layouts: this project's W_q/W_k (q_norm/k_norm under qk-layernorm),
transformers' q_proj/k_proj (q_norm/k_norm where present), fused q|k|v projections (nanoGPT's and
GPT-2's c_attn, qkv_proj, Wqkv, ...), multi-head latent attention's q_b_proj / kv_a_proj_with_mqa /
kv_b_proj, nn.MultiheadAttention's in_proj_weight. A layout the doctor misreads is caught by
measurement: the checks verify that scaling a site scaled the scores.
"""
from contextlib import ExitStack, contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_doctor.signals import doctor_hook

NORM_PAIRS = [("q_norm", "k_norm"), ("q_layernorm", "k_layernorm"), ("query_layernorm", "key_layernorm"),
              ("q_ln", "k_ln")]
PROJ_PAIRS = [("q_proj", "k_proj"), ("W_q", "W_k"), ("query", "key"), ("wq", "wk"), ("to_q", "to_k"),
              ("q", "k"), ("query_proj", "key_proj"), ("linear_q", "linear_k"), ("q_lin", "k_lin")]
FUSED = ("c_attn", "qkv_proj", "Wqkv", "qkv", "query_key_value", "qkv_linear", "W_pack", "att_proj", "in_proj")
HEADS = ("num_heads", "num_attention_heads", "n_head", "n_heads")
KV_HEADS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "n_kv_head", "kv_heads")
HEAD_DIM = ("head_dim", "head_size", "d_k")


def _attr(m, names):
    for n in names:
        v = getattr(m, n, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def _child(m, name):
    c = getattr(m, name, None)
    return c if isinstance(c, nn.Module) else None


@contextmanager
def _hooks(*pairs):
    """Forward hooks, (module, fn) each, held for the with block and removed on the way out. They
    run inside the target's forward: what they raise is a DoctorBug, never the target's."""
    handles = [m.register_forward_hook(doctor_hook(fn)) for m, fn in pairs]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class Site:
    """q and k of one attention module. `scaled(fq, fk)`: a context in which q is multiplied by fq
    and k by fk; `measuring(out)`: a context that appends (rms q, rms k) of each call to out."""
    def __init__(self, name, module):
        self.name, self.module = name, module

    def on(self, root):
        """The same site in a copy of the target (root: the copy's top module)."""
        return site_of(self.name, root.get_submodule(self.name) if self.name else root)


class PairSite(Site):
    """q and k come out of two child modules."""
    def __init__(self, name, module, q, k):
        super().__init__(name, module)
        self.q, self.k = q, k

    @contextmanager
    def scaled(self, fq, fk):
        with _hooks((self.q, lambda m, i, o: _mul(o, fq)), (self.k, lambda m, i, o: _mul(o, fk))):
            yield

    @contextmanager
    def measuring(self, out):
        got = {}
        def hq(m, i, o):
            got["q"] = _rms(o)
        def hk(m, i, o):
            out.append((got.pop("q", float("nan")), _rms(o)))
        with _hooks((self.q, hq), (self.k, hk)):
            yield


class FusedSite(Site):
    """q | k | v come out of one projection, q first, then k (sizes q_size, k_size)."""
    def __init__(self, name, module, proj, q_size, k_size):
        super().__init__(name, module)
        self.proj, self.q_size, self.k_size = proj, q_size, k_size

    def _split(self, o):
        q, k = self.q_size, self.k_size
        return o[..., :q], o[..., q:q + k], o[..., q + k:]

    @contextmanager
    def scaled(self, fq, fk):
        def hook(m, i, o):
            t = o[0] if isinstance(o, tuple) else o
            q, k, rest = self._split(t)
            t = torch.cat([q * fq, k * fk, rest], dim=-1)
            return (t,) + tuple(o[1:]) if isinstance(o, tuple) else t
        with _hooks((self.proj, hook)):
            yield

    @contextmanager
    def measuring(self, out):
        def hook(m, i, o):
            q, k, _ = self._split(o[0] if isinstance(o, tuple) else o)
            out.append((_rms(q), _rms(k)))
        with _hooks((self.proj, hook)):
            yield


class MLASite(Site):
    """Multi-head latent attention (DeepSeek-V2's names): q out of q_b_proj (or q_proj); each head's
    k is [its first qk_nope_head_dim columns of kv_b_proj's (nope + v) | the rope part shared by the
    heads: kv_a_proj_with_mqa's columns after kv_lora_rank]."""
    def __init__(self, name, module, q, kv_a, kv_b, nope, rope, v_dim, lora):
        super().__init__(name, module)
        self.q, self.kv_a, self.kv_b = q, kv_a, kv_b
        self.nope, self.rope, self.v_dim, self.lora = nope, rope, v_dim, lora

    def _nope_v(self, o):
        return o.unflatten(-1, (-1, self.nope + self.v_dim)).split([self.nope, self.v_dim], -1)

    @contextmanager
    def scaled(self, fq, fk):
        def kv_b(m, i, o):
            n, v = self._nope_v(o)
            return torch.cat([n * fk, v], -1).flatten(-2)
        def kv_a(m, i, o):
            return torch.cat([o[..., :self.lora], o[..., self.lora:] * fk], -1)
        with _hooks((self.q, lambda m, i, o: _mul(o, fq)), (self.kv_a, kv_a), (self.kv_b, kv_b)):
            yield

    @contextmanager
    def measuring(self, out):
        got = {}
        def done():
            if len(got) == 3:   # q, and k's mean square over its nope and rope columns
                ms = (self.nope * got.pop("nope") + self.rope * got.pop("rope")) / (self.nope + self.rope)
                out.append((got.pop("q"), ms ** 0.5))
        def hq(m, i, o):
            got["q"] = _rms(o)
            done()
        def ha(m, i, o):
            got["rope"] = _rms(o[..., self.lora:]) ** 2
            done()
        def hb(m, i, o):
            got["nope"] = _rms(self._nope_v(o)[0]) ** 2
            done()
        with _hooks((self.q, hq), (self.kv_a, ha), (self.kv_b, hb)):
            yield


def _mla(name, m):
    q = _child(m, "q_b_proj") if _child(m, "q_b_proj") is not None else _child(m, "q_proj")
    kv_a, kv_b = _child(m, "kv_a_proj_with_mqa"), _child(m, "kv_b_proj")
    if q is None or kv_a is None or kv_b is None:
        return None
    cfg = getattr(m, "config", None)
    dims = [getattr(m, a, None) or getattr(cfg, a, None)
            for a in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank")]
    if not all(isinstance(d, int) and d > 0 for d in dims):
        return None
    return MLASite(name, m, q, kv_a, kv_b, *dims)


class MHASite(Site):
    """nn.MultiheadAttention: q and k rows of in_proj_weight (and bias), scaled in place and
    restored; measured from the query and key it is called with."""
    def _wb(self):
        m = self.module
        E = m.embed_dim
        if m.in_proj_weight is not None:
            return [(m.in_proj_weight, slice(0, E)), (m.in_proj_weight, slice(E, 2 * E))], \
                   [(m.in_proj_bias, slice(0, E)), (m.in_proj_bias, slice(E, 2 * E))]
        return [(m.q_proj_weight, slice(None)), (m.k_proj_weight, slice(None))], \
               [(m.in_proj_bias, slice(0, E)), (m.in_proj_bias, slice(E, 2 * E))]

    @contextmanager
    def scaled(self, fq, fk):
        ws, bs = self._wb()
        saved = []
        with torch.no_grad():
            for (p, sl), f in list(zip(ws, (fq, fk))) + list(zip(bs, (fq, fk))):
                if p is None:
                    continue
                saved.append((p, sl, p[sl].clone()))
                p[sl] *= f
        try:
            yield
        finally:
            with torch.no_grad():
                for p, sl, v in saved:
                    p[sl] = v

    @contextmanager
    def measuring(self, out):
        def pre(m, args, kwargs):
            q_in = args[0] if args else kwargs["query"]
            k_in = args[1] if len(args) > 1 else kwargs.get("key")
            if not (isinstance(k_in, torch.Tensor) and k_in.is_floating_point() and k_in.shape[-1] == q_in.shape[-1]):
                k_in = q_in   # a subclass called as forward(x, ...): self-attention
            (wq, sq), (wk, sk) = self._wb()[0]
            (bq, bsq), (bk, bsk) = self._wb()[1]
            q = F.linear(q_in, wq[sq], None if bq is None else bq[bsq])
            k = F.linear(k_in, wk[sk], None if bk is None else bk[bsk])
            out.append((_rms(q), _rms(k)))
        h = self.module.register_forward_pre_hook(doctor_hook(pre), with_kwargs=True)
        try:
            yield
        finally:
            h.remove()


def _mul(o, f):
    if isinstance(o, tuple):
        return (o[0] * f,) + tuple(o[1:])
    return o * f


def _rms(t) -> float:
    t = t[0] if isinstance(t, tuple) else t
    return float(t.detach().double().pow(2).mean().sqrt())


def site_of(name: str, m: nn.Module) -> Site | None:
    """The q/k site of module m if its layout is known, else None."""
    if isinstance(m, nn.MultiheadAttention):
        return MHASite(name, m)
    mla = _mla(name, m)
    if mla is not None:
        return mla
    for pairs in (NORM_PAIRS, PROJ_PAIRS):
        for a, b in pairs:
            q, k = _child(m, a), _child(m, b)
            if q is not None and k is not None:
                return PairSite(name, m, q, k)
    for f in FUSED:
        proj = _child(m, f)
        if proj is None:
            continue
        width = getattr(proj, "out_features", None) or getattr(proj, "nf", None)
        h, hkv, d = _attr(m, HEADS), _attr(m, KV_HEADS), _attr(m, HEAD_DIM)
        if h and d and hkv and width == (h + 2 * hkv) * d:
            return FusedSite(name, m, proj, h * d, hkv * d)
        if width and width % 3 == 0:
            return FusedSite(name, m, proj, width // 3, width // 3)
    return None


def _looks_like_attention(m: nn.Module) -> bool:
    n = type(m).__name__.lower()
    return "attention" in n or "attn" in n


def attention_modules(root: nn.Module) -> list[tuple[str, nn.Module, Site | None]]:
    """(name, module, site) of each attention module: a module with a known q/k layout (its site),
    or one whose class name says attention; where the layout is not known
    (site None: q and k cannot be reached, its calls are still seen), the outermost such module
    that neither holds nor sits in one with a site (a hybrid's softmax layers beside its linear ones)."""
    sited = []
    for name, m in root.named_modules():
        s = site_of(name, m)
        # a class name that says attention, or a layout no other layer has (LongcatFlashMLA): a
        # fused `in_proj` or a bare q/k pair alone does not make a module attention (Mamba's mixer)
        if s is not None and (isinstance(m, nn.MultiheadAttention) or _looks_like_attention(m) or _distinctive(s)):
            sited.append((name, m, s))
    # an attention module inside another one with a site (a wrapper's core) is the same layer
    names = [n for n, _, _ in sited]
    sited = [f for f in sited if not any(f[0] != o and _nested(f[0], o) for o in names)]
    names = [n for n, _, _ in sited]
    found, outer = list(sited), []
    for name, m in root.named_modules():
        if not _looks_like_attention(m) or name in names or any(name.startswith(o + ".") for o in outer):
            continue
        related = any(_nested(name, o) or _nested(o, name) for o in names)
        if not related:
            outer.append(name)
            found.append((name, m, None))
    order = {n: i for i, (n, _) in enumerate(root.named_modules())}
    return sorted(found, key=lambda f: order[f[0]])


def _distinctive(site) -> bool:
    if isinstance(site, MLASite):
        return True
    if isinstance(site, PairSite):
        names = {n for n, c in site.module.named_children() if c is site.q or c is site.k}
        return not names <= {"q", "k", "query", "key"}
    return False


def _nested(inner: str, outer: str) -> bool:
    return outer == "" or inner.startswith(outer + ".")


@contextmanager
def scaled_sites(sites: list[Site], fq, fk):
    """Every site's q times fq and k times fk (numbers, or {site name: number})."""
    with ExitStack() as stack:
        for s in sites:
            a = fq[s.name] if isinstance(fq, dict) else fq
            b = fk[s.name] if isinstance(fk, dict) else fk
            stack.enter_context(s.scaled(a, b))
        yield


@contextmanager
def measured_sites(sites: list[Site], out: dict):
    """out[site name] = [(rms q, rms k) per call] during the block."""
    with ExitStack() as stack:
        for s in sites:
            stack.enter_context(s.measuring(out.setdefault(s.name, [])))
        yield
