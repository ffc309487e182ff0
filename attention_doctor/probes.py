"""What happens inside attention during a forward: every attention call, seen through torch's
function modes (scaled_dot_product_attention; softmax, with the matmuls or einsums on either side
of it; a hand-made normalisation between two such products, handmade.py) and through this
project's Recorder where its explicit path runs. A call holds what could be seen of it: the scores
the softmax got, the weights, q, k, v and the output."""
import math
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from attention_doctor import flex
from attention_doctor.handmade import SCORES_FIT, as_matmul, einsum_operands, fitted_scale, normalised_dim, output_order
from attention_doctor.signals import doctor_hook

SDPA = {F.scaled_dot_product_attention}
SOFTMAX = {F.softmax, torch.softmax, torch.Tensor.softmax, torch.special.softmax}
SIGMOID = {F.sigmoid, torch.sigmoid, torch.Tensor.sigmoid, torch.special.expit}   # sigmoid attention's weights
MATMUL = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.Tensor.bmm}
BADDBMM = {torch.baddbmm, torch.Tensor.baddbmm}
EXP = {torch.exp, torch.Tensor.exp}
CAT = {torch.cat, torch.concat, torch.concatenate}
DIV = {torch.div, torch.true_divide, torch.Tensor.div, torch.Tensor.__truediv__}   # a hand-made normalisation's
MASKED = -1e3  # a score below this at init is a masked one (fills: -inf, finfo.min, -1e4)
TERMS = 8      # products kept before the pending one: the terms a sum of scores may add


def _cleaned(a: torch.Tensor, w: torch.Tensor) -> bool:
    """a is the softmax's weights w with only their zero or non-finite entries set to 0 (a fully masked
    row's NaN cleaned after the softmax, as CpmAnt's masked_fill(score, ~mask, 0) does): the same mix of
    the values wherever w has one, so still this call's."""
    kept = a != 0
    gone = w[~kept]
    return torch.equal(a[kept], w[kept]) and bool(((gone == 0) | ~torch.isfinite(gone)).all())


@dataclass
class Call:
    source: str                       # sdpa | flex | softmax | handmade (no softmax call: handmade.py) | project
    module: str = ""
    q: torch.Tensor | None = None     # (B, h, T_q, d), k and v repeated to h heads
    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    out: torch.Tensor | None = None   # (B, h, T_q, d_v)
    scores: torch.Tensor | None = None   # what the softmax got (masked entries filled)
    weights: torch.Tensor | None = None
    visible: torch.Tensor | None = None  # bool, broadcastable to the scores; None: not known
    bias: torch.Tensor | None = None     # sdpa's additive float mask
    scale: float | None = None
    dropout_p: float = 0.0
    dim: int = -1                        # the softmax's dim
    extra: dict = field(default_factory=dict)

    @property
    def sigmoid(self) -> bool:
        """Its weights are sigmoid(scores), each in (0, 1) on its own (sigmoid attention): no row sums to one."""
        return self.extra.get("normaliser") == "sigmoid"

    def normalised(self, s: torch.Tensor) -> torch.Tensor:
        """The weights of scores s as this call makes them (softmax over the keys, or sigmoid)."""
        return torch.sigmoid(s) if self.sigmoid else torch.softmax(s, dim=-1)

    @property
    def traced(self) -> bool:
        """Its scores are the ones a normalisation got in the trace (masks inferred from them)."""
        return self.source in ("softmax", "handmade")

    @property
    def fused(self) -> bool:
        """One call given q, k, v, its mask and scale (SDPA, FlexAttention): the probe scales q and k in it."""
        return self.source in ("sdpa", "flex")

    @property
    def complete(self) -> bool:
        """q, k, v, out and how they were masked and scaled are known, or the scores the softmax got
        (a sum of q k^T and other terms: its scale is not one ratio): the call can be recomputed."""
        return all(t is not None for t in (self.q, self.k, self.v, self.out)) and (
            self.scale is not None or self.traced and self.scores is not None)

    def raw(self) -> torch.Tensor:
        """q k^T * scale in float64 (no mask; a scale not known is taken as 1: a hand-made
        normalisation without an exp normalises the product as it is)."""
        return (self.q.double() @ self.k.double().transpose(-2, -1)) * (1.0 if self.scale is None else self.scale)

    def seen_scores(self) -> torch.Tensor:
        """The scores as the softmax saw them (for sdpa: recomputed in float64, mask added)."""
        if self.scores is not None:
            return self.scores
        s = self.raw()
        if self.bias is not None:   # a float mask is added as it is: a finite fill stays finite
            return s + self.bias.double()
        if self.visible is not None:
            s = s.masked_fill(~self.visible, float("-inf"))
        return s

    def seen_weights(self) -> torch.Tensor:
        if self.weights is not None:
            return self.weights
        return self.normalised(self.seen_scores())

    def reference(self, dtype=torch.float64) -> torch.Tensor:
        """The textbook attention on this call's q, k, v: softmax(q k^T scale + mask) v in `dtype`
        (scores as `(q @ k^T) * scale` in that dtype: PyTorch's standard attention); for an eager
        trace, softmax(the scores it saw) v (sigmoid attention: sigmoid for softmax)."""
        q, k, v = self.q.to(dtype), self.k.to(dtype), self.v.to(dtype)
        if self.traced and self.scores is not None:
            # an eager trace: the scores as the softmax saw them (an additive bias the doctor cannot
            # attribute, ALiBi or a learned mask, is in them); the check covers softmax and weights @ V
            s = self.scores.to(dtype)
        else:
            s = (q @ k.transpose(-2, -1)) * self.scale
            if "flex_mods" in self.extra:   # the score_mod and mask_mod, applied in this dtype
                s = self.extra["flex_mods"](s)
        if self.bias is not None:
            s = s + self.bias.to(dtype)
        vis = self.visible
        if vis is not None:
            s = s.masked_fill(~vis, float("-inf"))
        w = self.normalised(s)
        if vis is not None:  # a row with no visible key: the reference returns 0, not NaN
            w = w.masked_fill(~vis.expand_as(w).any(-1, keepdim=True), 0.0)
        return w @ v


def _expand(k, h):
    """k (B, h_kv, T, d) repeated to h heads (query head i reads kv head i // group)."""
    if k.dim() == 4 and k.shape[1] != h and h % k.shape[1] == 0:
        return k.repeat_interleave(h // k.shape[1], dim=1)
    return k


def _like(t, lead):
    """t (..., X, Y) viewed with leading dims `lead` when it holds the same elements (a
    (B h, T, d) batch of heads as (B, h, T, d)); else t as it is."""
    if tuple(t.shape[:-2]) == tuple(lead) or t.numel() != math.prod(lead) * t.shape[-2] * t.shape[-1]:
        return t
    return t.reshape(tuple(lead) + tuple(t.shape[-2:]))


def _heads_inner(prod, s, dim) -> bool:
    """The softmax's scores s (..., T_q, h, T_k), over the keys, are q k^T's rows (..., T_q h, T_k)
    regrouped, queries outer and heads inner (multi-query attention packed as GPT-BigCode packs it)."""
    return (s.dim() >= 4 and dim == s.dim() - 1 and prod.dim() == s.dim() - 1 and prod.shape[-1] == s.shape[-1]
            and prod.shape[-2] == s.shape[-3] * s.shape[-2] and prod.shape[-2] != s.shape[-2]
            and prod.numel() == s.numel())


def _heads_first(t, T, h):
    """t (..., T h, X), rows queries outer and heads inner, as (..., h, T, X); or (..., T, h, X) likewise."""
    return t.reshape(*t.shape[:-2 if t.shape[-2] == T * h else -3], T, h, t.shape[-1]).transpose(-3, -2)


def _widened(t, block, width):
    """t (..., n, d) as rows `block` of (..., width, d), the other rows zero."""
    out = t.new_zeros(t.shape[:-2] + (width, t.shape[-1]))
    out[..., block, :] = t
    return out


def _arg(args, kwargs, i, name, default=None):
    if name in kwargs:
        return kwargs[name]
    return args[i] if len(args) > i else default


class Probe(TorchFunctionMode):
    """with Probe(modules) as p: model(x)  ->  p.calls.

    modules: [(name, module)] of the attention modules; function calls are recorded only while
    one of them runs (all of them when the list is empty).

    Scores amplified inside the calls (the fallback where no q/k site is known): qk_factor
    multiplies q and k of every sdpa call, and the two inputs of each matmul named in qk_matmuls
    ((module, n): the n-th matmul that module ran in this forward, one a softmax took the
    output of in an earlier trace: `call.extra["qk_matmul"]`); qk_where: the modules where this
    applies (None: all). keep_graph: each call keeps its q and k with their autograd history
    (`call.extra["graph"]`: measured.py finds the projections they come from); on_call: called as
    each call is recorded."""

    def __init__(self, modules=(), qk_factor: float | None = None, qk_where=None, qk_matmuls=(), keep_graph=False):
        super().__init__()
        self.keep_graph, self.on_call = keep_graph, None
        self.modules = list(modules)
        self.qk_factor = qk_factor
        self.qk_where = None if qk_where is None else set(qk_where)
        self.qk_matmuls = set(qk_matmuls)
        self._matmuls: dict[str, int] = {}   # module -> matmuls it ran so far
        self.calls: list[Call] = []
        self.errors: list[Exception] = []   # raised by the probe's own code (a doctor bug), not the target
        self._stack: list[tuple[str, bool]] = []   # (module name, recorded by the project's recorder)
        self._hooks = []
        self._recorders = []
        self._pending_qk = None
        self._terms: list[tuple[str, tuple]] = []   # (module, product) of the products before the pending one
        self._pending_call = None
        self._pending_exp = self._pending_exp_out = None
        self._norms = []   # hand-made normalisations since the last call: (product, exp's input, weights, dim, cat)
        self._pending_order = None   # (permutation, shape) of the pending product's own output, where an einsum laid it out otherwise
        self._pending_cat = None   # (the cat's width, where the q k^T block starts in it)
        self._pending_sigmoid = None   # (scores, weights): a sigmoid of the scores, a call once weights @ v follows
        self._flex = None          # the context that routes flex_attention's calls to the probe
        self._in_flex = False      # inside a flex_attention call: its own ops are not the target's
        self._unscripted = None    # the context that runs the modules' TorchScript functions as Python

    # -- module scope ------------------------------------------------------------------------
    def __enter__(self):
        for name, m in self.modules:
            own = _project_explicit(m)
            if own:
                self._recorders.append((m, m.recorder))
                m.recorder = _Capture(self, name, m)
            self._hooks.append(m.register_forward_pre_hook(doctor_hook(lambda mod, a, n=name, o=own: self._stack.append((n, o)))))
            self._hooks.append(m.register_forward_hook(doctor_hook(lambda mod, a, out: self._stack.pop() and None)))
        self._flex = flex.intercepted(self._flex_attention)
        self._flex.__enter__()
        self._unscripted = unscripted([m for _, m in self.modules])
        self._unscripted.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        if self._unscripted is not None:
            self._unscripted.__exit__(*exc)
            self._unscripted = None
        if self._flex is not None:
            self._flex.__exit__(*exc)
            self._flex = None
        for h in self._hooks:
            h.remove()
        for m, r in self._recorders:
            m.recorder = r
        self._hooks, self._recorders = [], []
        return super().__exit__(*exc)

    def _recording(self) -> bool:
        if self._in_flex:
            return False
        if not self.modules:
            return True
        return bool(self._stack) and not self._stack[-1][1]

    def _where(self) -> str:
        return self._stack[-1][0] if self._stack else ""

    # -- function calls ----------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SDPA:
            return self._sdpa(func, args, kwargs)
        if func is F.multi_head_attention_forward:   # a Python function the mode sees whole
            with self._inside_functional():
                return func(*args, **kwargs)
        mm = None
        if (func in MATMUL or func in BADDBMM or func is torch.einsum) and self._recording():
            where = self._where()
            mm = (where, self._matmuls.get(where, 0))
            self._matmuls[where] = mm[1] + 1
            if mm in self.qk_matmuls and self._scaling(where):
                args, kwargs = doctor_hook(_scaled_matmul)(func, args, kwargs, self.qk_factor)
        out = func(*args, **kwargs)
        if self._recording():
            with self._kept():
                if func in SOFTMAX:
                    self._softmax(args, kwargs, out)
                elif func in SIGMOID:
                    self._sigmoid(args[0], out)
                elif func in MATMUL:
                    self._matmul(args[0], args[1], out, mm)
                elif func in BADDBMM:
                    self._matmul(_arg(args, kwargs, 1, "batch1"), _arg(args, kwargs, 2, "batch2"), out, mm)
                elif func is torch.einsum:
                    eq, ops = einsum_operands(args, kwargs)
                    abo = as_matmul(eq, *ops, out) if len(ops) == 2 and isinstance(out, torch.Tensor) else None
                    if abo is not None:
                        self._matmul(*abo, mm, order=output_order(eq), raw=out)
                elif func in EXP:
                    self._exp(args[0], out)
                elif func in CAT:
                    self._cat(_arg(args, kwargs, 0, "tensors"), _arg(args, kwargs, 1, "dim", 0), out)
                elif func in DIV:
                    self._div(args[0], out)
        return out

    @contextmanager
    def _kept(self):
        """The probe's own recording: what it raises is kept, the target's forward goes on, and
        Context.probe raises it after the forward as a DoctorBug (never the target's exception)."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 -- the probe's own code raised: kept for a DoctorBug (inconclusive: doctor error), never the target's
            self.errors.append(e)

    def _add(self, call, q=None, k=None):
        self._terms = []   # the terms of a later call's scores are made after this one
        self._norms = []
        self._pending_sigmoid = None   # the weights @ v that follows is this call's
        if self.keep_graph and q is not None and k is not None:
            call.extra["graph"] = (q, k)
        self.calls.append(call)
        if self.on_call is not None:
            self.on_call()

    def _scaling(self, where) -> bool:
        return self.qk_factor is not None and (self.qk_where is None or where in self.qk_where)

    @contextmanager
    def _inside_functional(self):
        """While the mode is paused (inside its own handler), the softmax, SDPA and bmm that
        torch.nn.functional's Python code calls are seen by swapping those names for the length
        of one call (nn.MultiheadAttention's forward is one such function)."""
        def seen(fn, handle):
            def wrapper(*a, **kw):
                return handle(fn, a, kw)
            return wrapper

        softmax, baddbmm = F.softmax, torch.baddbmm   # the originals: the names are swapped below

        def plain(fn, a, kw):
            out = fn(*a, **kw)
            if self._recording():
                with self._kept():
                    if fn is softmax:
                        self._softmax(a, kw, out)
                    elif fn is baddbmm:
                        self._matmul(_arg(a, kw, 1, "batch1"), _arg(a, kw, 2, "batch2"), out)
                    else:
                        self._matmul(a[0], a[1], out)
            return out
        swaps = [(F, "softmax", seen(F.softmax, plain)),
                 (F, "scaled_dot_product_attention", seen(F.scaled_dot_product_attention, self._sdpa)),
                 (torch, "bmm", seen(torch.bmm, plain)), (torch, "baddbmm", seen(torch.baddbmm, plain))]
        old = [(mod, name, getattr(mod, name)) for mod, name, _ in swaps]
        try:
            for mod, name, fn in swaps:
                setattr(mod, name, fn)
            yield
        finally:
            for mod, name, fn in old:
                setattr(mod, name, fn)

    def _sdpa(self, func, args, kwargs):
        args, kwargs = doctor_hook(self._sdpa_args)(args, kwargs)
        out = func(*args, **kwargs)
        if self._recording() or not self.modules:
            with self._kept():
                self._sdpa_call(args, kwargs, out)
        return out

    def _sdpa_args(self, args, kwargs):
        """SDPA's arguments with q, k, v positional, amplified where the probe scales them."""
        kwargs = dict(kwargs)   # q, k, v may come by name (diffusers' Flux processors: query=, key=, value=)
        args = tuple(args) + tuple(kwargs.pop(n) for n in ("query", "key", "value")[len(args):] if n in kwargs)
        q, k, v = args[0], args[1], args[2]
        if self._scaling(self._where()) and (self._recording() or not self.modules):
            args = (q * self.qk_factor, k * self.qk_factor, v) + tuple(args[3:])
        return args, kwargs

    def _sdpa_call(self, args, kwargs, out):
        q, k, v = args[0], args[1], args[2]
        mask = _arg(args, kwargs, 3, "attn_mask")
        dropout_p = float(_arg(args, kwargs, 4, "dropout_p", 0.0) or 0.0)
        is_causal = bool(_arg(args, kwargs, 5, "is_causal", False))
        scale = _arg(args, kwargs, 6, "scale")
        scale = 1 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        h = q.shape[-3] if q.dim() >= 3 else 1
        kk, vv = _expand(k.detach(), h), _expand(v.detach(), h)
        T_q, T_k = q.shape[-2], k.shape[-2]
        visible, bias = None, None
        if mask is not None and mask.dtype == torch.bool:
            visible = mask.detach()
        elif mask is not None:
            bias = mask.detach()
            visible = bias > MASKED
        if is_causal:  # SDPA's flag: a top-left aligned lower triangle
            visible = torch.ones(T_q, T_k, dtype=torch.bool, device=q.device).tril()
        self._add(Call("sdpa", self._where(), q=q.detach(), k=kk, v=vv, out=out.detach(),
                       visible=visible, bias=bias, scale=scale, dropout_p=dropout_p), q, _expand(k, h))

    def _flex_attention(self, fn, args, kwargs):
        """A flex_attention call (flex.py routes it here): q and k amplified where the probe scales
        them; with keep_graph, called on detached q, k, v where they carry autograd history (the
        graph up to q and k is what is kept: flex has no backward on CPU); recorded after it."""
        recording = self._recording() or not self.modules
        a = doctor_hook(flex.arguments)(args, kwargs)
        q, k, v = a["query"], a["key"], a["value"]
        if recording and self._scaling(self._where()):
            q, k = q * self.qk_factor, k * self.qk_factor
        graph = (q, k)
        if self.keep_graph and any(t.requires_grad for t in (q, k, v)):
            q, k, v = q.detach(), k.detach(), v.detach()
        a.update(query=q, key=k, value=v)
        args, kwargs = flex.with_arguments(a)
        self._in_flex = True   # flex's own ops, and the probe's below, are not the target's
        try:
            res = fn(*args, **kwargs)
            if recording:
                with self._kept():
                    self._flex_call(a, res[0] if isinstance(res, tuple) else res, graph)
        finally:
            self._in_flex = False
        return res

    def _flex_call(self, a, out, graph):
        q, k, v = a["query"], a["key"], a["value"]
        scale = 1 / math.sqrt(q.shape[-1]) if a["scale"] is None else float(a["scale"])
        h = q.shape[-3]
        kk, vv = _expand(k.detach(), h), _expand(v.detach(), h)
        mods = flex.mods(a["score_mod"], a["block_mask"])
        prod = (q.detach().double() @ kk.double().transpose(-2, -1)) * scale
        s = mods(prod)
        # masked as a softmax call's are: below MASKED (-inf, a score_mod's fill finfo.min or -1e4; true at init,
        # not amplified); a soft-cap saturated far out stays high
        call = Call("flex", self._where(), q=q.detach(), k=kk, v=vv, out=out.detach(), scores=s,
                    weights=flex.weights(s), visible=s > MASKED, scale=scale)
        call.extra["flex_mods"] = mods
        self._add(call, graph[0], _expand(graph[1], h))

    def _softmax(self, args, kwargs, out, laid_out=False):
        s = args[0]
        dim = _arg(args, kwargs, 1, "dim", -1)
        if not isinstance(s, torch.Tensor) or s.dim() < 3 or dim is None:
            return
        if not laid_out:   # read in (batch..., queries, keys) as the product's letters give
            (s, out), dim = self._canonical([s, out], dim)
        dim = dim % s.dim()
        # which scores are masked is inferred: below MASKED (true of a forward at init, not amplified)
        call = Call("softmax", self._where(), scores=s.detach(), weights=out.detach(), dim=dim - s.dim(),
                    visible=s.detach() > MASKED)
        qk, cat = self._pending_qk, self._pending_cat
        graph = (None, None)
        if qk is not None and qk[2].shape[-2:] == s.shape[-2:] and qk[2].numel() == s.numel():
            if qk[3] is not None:
                call.extra["qk_matmul"] = qk[3]
            a, b, prod = (_like(t, s.shape[:-2]) for t in qk[:3])   # (B h, T, d) -> (B, h, T, d) (Bloom, NeoX)
            h = a.shape[-3] if a.dim() >= 3 else 1
            graph = (a, _expand(b.transpose(-2, -1), h))
            call.q, call.k = graph[0].detach(), graph[1].detach()
            ratio = (s.detach().double() / prod.detach().double())[(s > MASKED) & (prod.abs() > 1e-12)]
            call.scale = float(ratio.median()) if ratio.numel() else None
        elif qk is not None and cat is not None and s.shape[-1] == cat[0] and s.shape[-2] == qk[2].shape[-2] \
                and s.numel() // cat[0] == qk[2].numel() // qk[2].shape[-1]:
            # q k^T's scores concatenated with other columns (attention sinks' logits): those are keys
            # whose k and v are zero, and whose scores are what was concatenated
            if qk[3] is not None:
                call.extra["qk_matmul"] = qk[3]
            a, b, prod = (_like(t, s.shape[:-2]) for t in qk[:3])
            h = a.shape[-3] if a.dim() >= 3 else 1
            graph = (a, _expand(b.transpose(-2, -1), h))
            block = slice(cat[1], cat[1] + prod.shape[-1])
            call.q, call.k = graph[0].detach(), _widened(graph[1].detach(), block, cat[0])
            call.extra["key_block"] = block
            call.scale = fitted_scale(s.detach()[..., block], prod, call.visible[..., block])   # a row maximum may be off
        elif qk is not None and _heads_inner(qk[2], s, dim):
            # multi-query attention packed queries outer, heads inner (GPT-BigCode: (B, T_q h, d) @ (B, d, T_k)
            # viewed as (B, T_q, h, T_k)): the call as (B, h, T_q, T_k), the one k (and v) for every head
            if qk[3] is not None:
                call.extra["qk_matmul"] = qk[3]
            T, h = s.shape[-3], s.shape[-2]
            call.extra["heads_inner"] = (T, h)
            call.scores, call.weights = _heads_first(s.detach(), T, h), _heads_first(out.detach(), T, h)
            call.visible = call.scores > MASKED
            k = qk[1].transpose(-2, -1)
            graph = (_heads_first(qk[0], T, h), k.unsqueeze(-3).expand(*k.shape[:-2], h, *k.shape[-2:]))
            call.q, call.k = graph[0].detach(), graph[1].detach()
            prod = _heads_first(qk[2], T, h)
            ratio = (call.scores.double() / prod.double())[call.visible & (prod.abs() > 1e-12)]
            call.scale = float(ratio.median()) if ratio.numel() else None
        elif qk is not None and (term := self._summed_term(s)) is not None:
            # scores that are a sum of products and other terms (XLNet: content q k^T + position terms
            # shifted into place): the product of the scores' shape made since the module's last call;
            # its scale is what scaling its operands moves the scores by, measured by the checks that need it
            if term[3] is not None:
                call.extra["qk_matmul"] = term[3]
            a, b, prod = (_like(t, s.shape[:-2]) for t in term[:3])
            h = a.shape[-3] if a.dim() >= 3 else 1
            graph = (a, _expand(b.transpose(-2, -1), h))
            call.q, call.k = graph[0].detach(), graph[1].detach()
            call.extra["summed"] = True
        self._pending_qk = self._pending_cat = None
        self._pending_call = call
        self._add(call, *graph)

    def _sigmoid(self, s, out):
        """A sigmoid of the pending q k^T's scores (after a scale, a bias, a mask: the same shape) may
        be sigmoid attention's weights, each key's on its own: kept until the next product, which makes
        it a call where it takes a matrix of the weights' shape (weights @ v; CoPE's gates, a sigmoid
        of the scores too, go into a cumsum, not @ v). A sigmoid of anything else (a gate) is not."""
        qk = self._pending_qk
        (s, out), _ = self._canonical([s, out])
        if qk is None or not isinstance(s, torch.Tensor) or s.dim() < 3 or s.shape[-2:] != qk[2].shape[-2:] \
                or s.numel() != qk[2].numel():
            return
        self._pending_sigmoid = (s.detach(), out)

    def _sigmoid_weights(self, a):
        """The pending sigmoid as a call, where the product about to be read takes its weights (`a`)."""
        s, out = self._pending_sigmoid
        self._pending_sigmoid = None
        if a.shape[-2:] == s.shape[-2:] and a.numel() == s.numel():
            self._softmax((s,), {"dim": -1}, out, laid_out=True)
            self._pending_call.extra["normaliser"] = "sigmoid"

    def _summed_term(self, s):
        """The latest product before the pending one, made in this module since its last call, whose
        output has the scores' shape (a term the scores sum): (a, b, product, matmul) or None."""
        where = self._where()
        for w, t in reversed(self._terms):
            if w == where and t[2].shape[-2:] == s.shape[-2:] and t[2].numel() == s.numel():
                return t
        return None

    def _cat(self, tensors, dim, out):
        """A cat along the last dim of the pending q k^T's scores with other columns: where the block sits."""
        qk = self._pending_qk
        if isinstance(tensors, (list, tuple)) and tensors:
            (out, *tensors), _ = self._canonical([out, *tensors])
        if qk is None or not isinstance(out, torch.Tensor) or out.dim() < 2 or not isinstance(tensors, (list, tuple)) \
                or dim % out.dim() != out.dim() - 1:
            return
        start = 0
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.dim() != out.dim():
                return
            if t.shape[-2:] == qk[2].shape[-2:] and t.numel() == qk[2].numel():
                self._pending_cat = (out.shape[-1], start)
                return
            start += t.shape[-1]

    def _canonical(self, ts, dim=None):
        """Tensors laid out as the pending product's own einsum output (e.g. 'bqhd,bkhd->bqhk': (B, T_q,
        H, T_k)) in the order its letters give (batch..., queries, keys): the queries are the letter only q
        has, the keys the letter only k has, whatever the notation's order. A tensor of the output's shape
        but another width of the keys (a sink column joined) too, where the keys come last in both. `dim`,
        an axis of the first tensor, moves with it. (ts, dim) as they are where the first does not fit."""
        order = self._pending_order if self._pending_qk is not None else None
        if order is None or not ts:
            return ts, dim
        perm, shape = order
        n = len(perm)

        def fits(t):
            return isinstance(t, torch.Tensor) and t.dim() == n and (
                t.shape == shape or perm[-1] == n - 1 and t.shape[:-1] == shape[:-1])

        if not fits(ts[0]):
            return ts, dim
        return [t.permute(perm) if fits(t) else t for t in ts], None if dim is None else perm.index(dim % n) - n

    def _matmul(self, a, b, out, mm=None, order=None, raw=None):
        if not isinstance(out, torch.Tensor) or out.dim() < 3:
            return
        if self._pending_sigmoid is not None:
            self._sigmoid_weights(a)
        c = self._pending_call
        block = c.extra.get("key_block") if c is not None else None
        packed = c.extra.get("heads_inner") if c is not None else None
        if packed is not None and c.weights is not None and a.shape[-2] == packed[0] * packed[1] \
                and a.shape[-1] == c.weights.shape[-1] and a.numel() == c.weights.numel():
            # the packed weights @ the one v (B, T_k, d_v): every head reads it
            v = b.detach()
            c.v = v.unsqueeze(-3).expand(*v.shape[:-2], packed[1], *v.shape[-2:])
            c.out = _heads_first(out.detach(), *packed)
            self._pending_call = None
        elif c is not None and c.weights is not None and (a.shape[-2:] == c.weights.shape[-2:] or block is not None and (
                a.shape[-2] == c.weights.shape[-2] and a.shape[-1] == block.stop - block.start)):
            self._pending_call = None
            if block is None and a.shape == c.weights.shape and not torch.equal(a.detach(), c.weights.to(a.dtype)) \
                    and not _cleaned(a.detach(), c.weights.to(a.dtype)):
                # the product took other weights of this shape (differential attention's A1 - lambda A2): its
                # output is no mix of this call's values, so neither is this call's v and out
                c.extra["combined_weights"] = True
                c.extra["applied_weights"] = a.detach()   # what the product mixed (a window applied after the softmax)
                return
            lead = c.weights.shape[:-2]
            c.v = _expand(_like(b.detach(), lead), c.q.shape[-3] if c.q is not None and c.q.dim() >= 3 else 1)
            if block is not None:   # the weights of the q k^T block @ v: the other columns' values are zero
                c.v = _widened(c.v, block, c.weights.shape[-1])
            c.out = _like(out.detach(), lead)
        elif not self._handmade(a, b, out) and not self._normalised_before(a, b, out, mm):
            if self._pending_qk is not None:
                self._terms = (self._terms + [(self._where(), self._pending_qk)])[-TERMS:]
            self._pending_qk = (a, b, out.detach().clone(), mm)   # a copy: the scale may be applied in place (Falcon's /=)
            self._pending_order = None if order is None else (order, raw.shape)
            self._pending_exp = self._pending_cat = None

    def _div(self, num, out):
        """A division whose output has the pending q k^T's rows (its keys, or those with sink columns
        joined) and sums to one along them: a hand-made normalisation, remembered for the product that
        takes weights made of it (_normalised_before)."""
        qk, cat = self._pending_qk, self._pending_cat
        if qk is None or not isinstance(out, torch.Tensor) or out.dim() < 3 or not out.is_floating_point():
            return
        (out,), _ = self._canonical([out])
        prod = qk[2]
        if out.shape[-2] != prod.shape[-2] or out.numel() // out.shape[-1] != prod.numel() // prod.shape[-1] \
                or out.shape[-1] not in (prod.shape[-1], cat[0] if cat is not None else None):
            return
        e, exp = self._pending_exp, self._pending_exp_out
        e = e if e is not None and e.shape == out.shape else None
        dim = normalised_dim(out)
        if dim is None and e is not None and isinstance(num, torch.Tensor) and exp is not None \
                and num.data_ptr() == exp.data_ptr() and num.shape == exp.shape:
            dim = -1   # the exp of the scores over its sum, whatever it came to (not finite once amplified)
        if dim is None:
            return
        self._norms = (self._norms + [(qk, e, out.detach(), dim, cat)])[-TERMS:]

    def _normalised_before(self, a, b, out, mm) -> bool:
        """weights @ v whose weights are made of hand-made normalisations remembered (self._norms), not
        one of them as it is: a sink column's weights dropped (the q k^T block of the last one), or maps
        combined (differential attention's A1 - lambda A2). Each becomes a call, as a softmax would; False
        where `a` is none of these."""
        if not self._norms or b.dim() < 2 or b.shape[-2] != a.shape[-1]:
            return False
        qk, e, w, dim, cat = self._norms[-1]
        if cat is not None and e is not None and w.shape[-1] == cat[0] and a.shape[-1] == qk[2].shape[-1] \
                and a.numel() == qk[2].numel():
            block = slice(cat[1], cat[1] + a.shape[-1])
            mine = _like(a.detach(), w.shape[:-2])
            if mine.shape != w[..., block].shape or not torch.allclose(mine, w[..., block].to(a.dtype), rtol=0, atol=0,
                                                                      equal_nan=True):
                return False
            self._pending_qk, self._pending_cat = qk, cat   # read as a softmax of the joined scores
            self._softmax((e,), {"dim": dim}, w, laid_out=True)
            self._matmul(a, b, out, mm)   # now this call's weights @ v
            return True
        same = [n for n in self._norms if n[2].shape[-2:] == a.shape[-2:] and n[2].numel() == a.numel()]
        if not same:
            return False
        for qk, e, w, dim, _ in same:
            lead = w.shape[:-2]
            q, kt, prod = (_like(t, lead) for t in qk[:3])
            h = q.shape[-3] if q.dim() >= 3 else 1
            k = _expand(kt.transpose(-2, -1), h)
            call = Call("handmade", self._where(), q=q.detach(), k=k.detach(), weights=w, dim=dim)
            scale = None if e is None else fitted_scale(e, prod, e > MASKED, fit=SCORES_FIT, dim=dim)
            if scale is not None:   # the exp's input: the scores up to a constant per row
                call.scores, call.visible, call.scale = e, e > MASKED, scale
            if qk[3] is not None:
                call.extra["qk_matmul"] = qk[3]
            # the product took weights combined from several maps: its output is no mix of this call's values
            call.extra["combined_weights"] = True
            call.extra["applied_weights"] = _like(a.detach(), lead)
            self._add(call, q, k)
        self._pending_qk = self._pending_exp = self._pending_cat = None
        return True

    def _exp(self, t, out):
        """An exp of the pending q k^T's shape: a hand-made softmax's scores (the row maximum may be off)."""
        qk = self._pending_qk
        (t,), _ = self._canonical([t])
        cat = self._pending_cat   # or of the scores with sink columns joined
        if qk is not None and isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-2] == qk[2].shape[-2] and (
                t.shape[-1] == qk[2].shape[-1] and t.numel() == qk[2].numel() or cat is not None and t.shape[-1] == cat[0]
                and t.numel() // cat[0] == qk[2].numel() // qk[2].shape[-1]):
            self._pending_exp, self._pending_exp_out = t.detach(), out

    def _handmade(self, a, b, out) -> bool:
        """weights @ v after a q k^T with no softmax call between them: the weights' rows (or
        columns) sum to one, or came out of an exp of the scores. Records the call; False when
        `a` is no such weights."""
        qk = self._pending_qk
        if qk is None or a.shape[-2:] != qk[2].shape[-2:] or a.numel() != qk[2].numel() or b.dim() < 2 \
                or b.shape[-2] != a.shape[-1]:
            return False
        lead = a.shape[:-2]
        q, kt, prod = (_like(t, lead) for t in qk[:3])
        e, dim = self._pending_exp, normalised_dim(a)
        if e is not None and e.shape[-1] != qk[2].shape[-1]:   # the exp of scores with sink columns joined: not a's
            e = None
        if e is not None:   # the exp of the scores (minus a row statistic), not of a gate of the same shape
            e = _like(e, lead)
            scale = fitted_scale(e, prod, e > MASKED, fit=SCORES_FIT, dim=dim or -1)
            e = None if scale is None else e
        if dim is None and e is None:
            return False
        h = q.shape[-3] if q.dim() >= 3 else 1
        k = _expand(kt.transpose(-2, -1), h)
        call = Call("handmade", self._where(), q=q.detach(), k=k.detach(), weights=_like(a.detach(), lead),
                    v=_expand(_like(b.detach(), lead), h), out=_like(out.detach(), lead), dim=dim or -1)
        if e is not None:   # the exp's input: the scores up to a constant per row
            call.scores, call.visible, call.scale = e, e > MASKED, scale
        if qk[3] is not None:
            call.extra["qk_matmul"] = qk[3]
        self._add(call, q, k)
        self._pending_qk = self._pending_exp = None
        return True


def _scaled_matmul(func, args, kwargs, f):
    """args, kwargs of a matmul (a @ b), an einsum of two operands or baddbmm (input + alpha batch1 @ batch2) with its two
    factors times f: its product, and so the scores, times f^2; a bias it adds is left alone."""
    if func in MATMUL:
        return (args[0] * f, args[1] * f) + tuple(args[2:]), kwargs
    if func is torch.einsum:
        eq, ops = einsum_operands(args, kwargs)
        return (eq, *[t * f for t in ops]), {k: v for k, v in kwargs.items() if k != "equation"}
    args, kwargs = list(args), dict(kwargs)
    for i, name in ((1, "batch1"), (2, "batch2")):
        if name in kwargs:
            kwargs[name] = kwargs[name] * f
        else:
            args[i] = args[i] * f
    return tuple(args), kwargs


@contextmanager
def unscripted(modules):
    """For the block, every global of the attention modules' own code modules that is bound to a
    TorchScript function runs its Python original instead (torch.jit.script keeps it as
    `_torchdynamo_inline`): a function mode sees nothing inside a script, and GPT-BigCode's upcast
    softmax (transformers 4.x, in half precision) is one. The arithmetic is the same; only what the
    probe sees changes."""
    homes = {id(d): d for d in (getattr(sys.modules.get(type(m).__module__), "__dict__", None) for m in modules)
             if isinstance(d, dict)}
    swapped = []
    for d in homes.values():
        for k, v in list(d.items()):
            if isinstance(v, torch.jit.ScriptFunction) and callable(getattr(v, "_torchdynamo_inline", None)):
                d[k] = v._torchdynamo_inline
                swapped.append((d, k, v))
    try:
        yield
    finally:
        for d, k, v in reversed(swapped):
            d[k] = v


def _project_explicit(m) -> bool:
    """This project's MultiHeadAttention on its explicit path: its Recorder sees every call."""
    cfg = getattr(m, "cfg", None)
    return type(m).__name__ == "MultiHeadAttention" and hasattr(m, "recorder") and hasattr(cfg, "use_sdpa") \
        and not cfg.use_sdpa


class _Capture:
    """A Recorder (attention.diagnostics's protocol) that hands each call to the probe."""
    needs_weights = True

    def __init__(self, probe: Probe, name: str, layer):
        self.probe, self.name = probe, name
        # scores = q k^T * scale with one scale: the call can be recomputed
        self.dot = layer.cfg.score in ("dot", "cosine") and layer.cfg.scale != "learned"

    def record_inputs(self, layer, args, kwargs):
        pass

    def record(self, name, q, k, scores, weights, mask, out=None, v=None, scale=1.0):
        with self.probe._kept():   # the doctor's code inside the target's forward
            self._record(q, k, scores, weights, mask, out, v, scale)

    def _record(self, q, k, scores, weights, mask, out, v, scale):
        h = q.shape[1]
        self.probe._add(Call("project", self.name, q=q.detach(), k=_expand(k.detach(), h),
                             v=None if v is None else _expand(v.detach(), h),
                             out=None if out is None else out.detach(),
                             scores=scores.detach(), weights=weights.detach(),
                             visible=None if mask is None else mask.detach(),
                             scale=scale if self.dot else None), q, _expand(k, h))
