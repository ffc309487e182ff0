"""q/k sites found by measurement, for the attention calls whose module has no layout in the
registry (layouts.py) or one that failed its check: by autograd, the projection q comes out of is
the last one (in the forward's order) whose output q depends on, and q's columns are the output
columns it depends on; the same for k. A fused q|k|v of any layout (LitGPT's grouped `qkv`,
interleaved heads), a list of projections (the Annotated Transformer's `linears`), projections on
a block that calls an attention function: each is found as it is computed. The site is then
checked like a registry one (scaling q by 2 must double q k^T)."""
from contextlib import contextmanager

import torch
import torch.nn as nn

from attention_doctor.layouts import Site, _hooks, _rms
from attention_doctor.signals import DoctorBug, TargetRaised


class ColumnSite(Site):
    """q is columns q_cols of projection q's output, k columns k_cols of projection k's (the same
    projection for a fused one). Named by its module; its parts by their names under the root."""
    def __init__(self, name, module, q_name, q, q_cols, k_name, k, k_cols):
        super().__init__(name, module)
        self.q_name, self.q, self.q_cols = q_name, q, q_cols
        self.k_name, self.k, self.k_cols = k_name, k, k_cols

    def on(self, root):
        get = lambda n: root.get_submodule(n) if n else root
        return ColumnSite(self.name, get(self.name), self.q_name, get(self.q_name), self.q_cols,
                          self.k_name, get(self.k_name), self.k_cols)

    def _factors(self, proj, o, fq, fk):
        f = torch.ones(o.shape[-1], dtype=o.dtype, device=o.device)
        if proj is self.q:
            f[self.q_cols.to(o.device)] = fq
        if proj is self.k:
            f[self.k_cols.to(o.device)] = fk
        return o * f

    @contextmanager
    def scaled(self, fq, fk):
        parts = {self.q, self.k}
        with _hooks(*[(p, lambda m, i, o: self._factors(m, o, fq, fk)) for p in parts]):
            yield

    @contextmanager
    def measuring(self, out):
        got = {}
        def hq(m, i, o):
            got["q"] = _rms(o[..., self.q_cols.to(o.device)])
            if m is self.k:
                out.append((got.pop("q"), _rms(o[..., self.k_cols.to(o.device)])))
        def hk(m, i, o):
            out.append((got.pop("q", float("nan")), _rms(o[..., self.k_cols.to(o.device)])))
        with _hooks(*([(self.q, hq)] if self.q is self.k else [(self.q, hq), (self.k, hk)])):
            yield


def _projections(root):
    """(name, module) of the leaf modules with a 2-D weight: nn.Linear and its kin (GPT-2's
    Conv1D, fairscale's parallel linears)."""
    return [(n, m) for n, m in root.named_modules()
            if not any(True for _ in m.children()) and isinstance(getattr(m, "weight", None), torch.Tensor)
            and m.weight.dim() == 2 and not isinstance(m, nn.Embedding)]


def _source(t, outs, before):
    """(name, module, columns) of the last projection output among outs[:before] that t depends
    on, or None."""
    live = [(n, m, o) for n, m, o in outs[:before] if o.requires_grad]
    if not live or not t.requires_grad:
        return None
    r = torch.randn(t.shape, generator=torch.Generator().manual_seed(7)).to(t.device, t.dtype)
    grads = torch.autograd.grad((t * r).sum(), [o for _, _, o in live], allow_unused=True, retain_graph=True)
    for (n, m, o), g in reversed(list(zip(live, grads))):
        if g is not None:
            cols = (g.detach().abs().reshape(-1, g.shape[-1]).sum(0) > 0).nonzero().flatten()
            if cols.numel():
                return n, m, cols.cpu()
    return None


def _owner(call_module, q_name, k_name):
    """The module the site is named by: the call's attention module, which must hold both
    projections (None otherwise); without one, the module the projections share (a block calling
    an attention function)."""
    inside = lambda n, o: o == "" or n.startswith(o + ".")
    if call_module:
        return call_module if inside(q_name, call_module) and inside(k_name, call_module) else None
    a, b = q_name.split(".")[:-1], k_name.split(".")[:-1]
    common = []
    for x, y in zip(a, b):
        if x != y:
            break
        common.append(x)
    return ".".join(common)


def find(ctx, sited: set) -> list[tuple[str, nn.Module, Site]]:
    """(owner name, owner, ColumnSite) for the calls of modules not in `sited`, found by autograd on
    one forward. Nothing where the forward runs without autograd (inference mode) or q and k
    depend on no projection."""
    from attention_doctor.probes import Probe
    root = ctx.adapter.module
    outs = []
    mods = [(n, m) for n, m, _ in ctx.modules]
    with Probe(mods, keep_graph=True) as p, torch.enable_grad(), \
            _hooks(*[(m, lambda m, i, o, n=n: outs.append((n, m, o)) if isinstance(o, torch.Tensor) else None)
                     for n, m in _projections(root)]):
        marks = []
        p.on_call = lambda: marks.append(len(outs))
        try:
            ctx.run(ctx.sample(k=95), grad=True)
        except TargetRaised:   # the target's error is the checks' to report
            return []
    if p.errors:
        raise DoctorBug(p.errors[0], "the probe") from p.errors[0]
    found, seen = [], set()
    for c, mark in zip(p.calls, marks):
        if c.module in sited or "graph" not in c.extra:
            continue
        q, k = c.extra["graph"]
        sq, sk = _source(q, outs, mark), _source(k, outs, mark)
        if sq is None or sk is None or (sq[1] is sk[1] and bool((sq[2][:, None] == sk[2][None]).any())):
            continue
        owner = _owner(c.module, sq[0], sk[0])
        if owner is None or owner in seen or owner in sited:
            continue
        seen.add(owner)
        module = root.get_submodule(owner) if owner else root
        found.append((owner, module, ColumnSite(owner, module, sq[0], sq[1], sq[2], sk[0], sk[1], sk[2])))
    return found
