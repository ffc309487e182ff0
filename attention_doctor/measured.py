"""q/k sites found by measurement, for the attention calls whose module has no layout in the
registry (layouts.py), one that failed its check or one that does not move the scores (a norm
after it): walking back over q's autograd graph, the modules q comes out of are the nearest
projections or shape-keeping modules (a q/k norm, an L2 clip), and q's columns are those of their
outputs it depends on; the same for k. A fused q|k|v of any layout (LitGPT's grouped `qkv`,
interleaved heads), a list of projections (the Annotated Transformer's `linears`), projections on
a block that calls an attention function: each is found as it is computed. The site is then
checked like a registry one (scaling q by 2 must double q k^T)."""
from contextlib import contextmanager

import torch
import torch.nn as nn

from attention_doctor.layouts import Site, _hooks
from attention_doctor.signals import DoctorBug, TargetRaised


class ColumnSite(Site):
    """q is made of columns of one or more module outputs, `q_parts` [(name under the root, module,
    columns)], k likewise: a fused q|k|v is one projection in both (disjoint columns); joint
    attention's q is its streams' projections (or norms) concatenated. Named by its module."""
    def __init__(self, name, module, q_parts, k_parts):
        super().__init__(name, module)
        self.q_parts, self.k_parts = list(q_parts), list(k_parts)

    def on(self, root):
        get = lambda n: root.get_submodule(n) if n else root
        return ColumnSite(self.name, get(self.name), [(n, get(n), c) for n, _, c in self.q_parts],
                          [(n, get(n), c) for n, _, c in self.k_parts])

    def _modules(self):
        out = []
        for _, m, _ in self.q_parts + self.k_parts:
            if not any(m is o for o in out):
                out.append(m)
        return out

    def _factors(self, m, o, fq, fk):
        t = o[0] if isinstance(o, tuple) else o
        f = torch.ones(t.shape[-1], dtype=t.dtype, device=t.device)
        for parts, x in ((self.q_parts, fq), (self.k_parts, fk)):
            for _, mod, cols in parts:
                if mod is m:
                    f[cols.to(t.device)] = x
        return (t * f,) + tuple(o[1:]) if isinstance(o, tuple) else t * f

    @contextmanager
    def scaled(self, fq, fk):
        with _hooks(*[(p, lambda m, i, o: self._factors(m, o, fq, fk)) for p in self._modules()]):
            yield

    @contextmanager
    def measuring(self, out):
        """(rms q, rms k) over their parts, appended once every part has run (once per call)."""
        acc, fired = {}, set()
        every = {(r, n) for r, parts in (("q", self.q_parts), ("k", self.k_parts)) for n, _, _ in parts}

        def hook(m, i, o):
            t = (o[0] if isinstance(o, tuple) else o).detach().double()
            for r, parts in (("q", self.q_parts), ("k", self.k_parts)):
                for n, mod, cols in parts:
                    if mod is m:
                        x = t[..., cols.to(t.device)]
                        s, c = acc.get(r, (0.0, 0))
                        acc[r] = (s + float(x.pow(2).sum()), c + x.numel())
                        fired.add((r, n))
            if fired == every:
                out.append(tuple((acc[r][0] / max(acc[r][1], 1)) ** 0.5 for r in ("q", "k")))
                acc.clear()
                fired.clear()
        with _hooks(*[(p, hook) for p in self._modules()]):
            yield


def _leaves(root):
    """(name, module) of the leaf modules but embeddings: where q and k may come out of."""
    return [(n, m) for n, m in root.named_modules() if not any(True for _ in m.children())
            and not isinstance(m, nn.Embedding)]


def _made(m, i, o) -> str | None:
    """What the call of leaf m made, where q or k may come out of it: "projection" (a weight of two
    or more dims mapping the last dim: nn.Linear and its kin, GPT-2's Conv1D, a mixture of experts'
    stacked weights), "kept" (its input's shape kept: a q/k norm, an L2 clip), else None."""
    if not isinstance(o, torch.Tensor) or not o.is_floating_point() or not i or not isinstance(i[0], torch.Tensor):
        return None
    w = getattr(m, "weight", None)
    if isinstance(w, torch.Tensor) and w.dim() >= 2 and o.shape[:-1] == i[0].shape[:-1]:
        return "projection"
    return "kept" if o.shape == i[0].shape else None


def _frontier(t, outs):
    """The outputs among outs ((name, module, output, from a projection) each) that t is computed
    from with none of the others between (a walk back over t's autograd graph that stops at them),
    each with the columns of that output t depends on: [(name, module, columns)]."""
    at = {f[2].grad_fn: i for i, f in enumerate(outs) if f[2].grad_fn is not None}   # a later module returning its input wins
    found, seen, todo = set(), set(), [t.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node in at:
            found.add(at[node])
        else:
            todo.extend(fn for fn, _ in node.next_functions)
    if not found:
        return []
    found = [outs[i] for i in sorted(found) if outs[i][2].requires_grad]
    r = torch.randn(t.shape, generator=torch.Generator().manual_seed(7)).to(t.device, t.dtype)
    with torch.enable_grad():   # the walk runs after the forward, whatever grad mode its caller is in
        loss = (t * r).sum()
    if not found or not loss.requires_grad:
        return []
    grads = torch.autograd.grad(loss, [o for _, _, o, _ in found], allow_unused=True, retain_graph=True)
    parts = []
    for (n, m, o, _), g in zip(found, grads):
        if g is not None:
            cols = (g.detach().abs().reshape(-1, g.shape[-1]).sum(0) > 0).nonzero().flatten()
            if cols.numel():
                parts.append((n, m, cols.cpu()))
    return parts


def _overlap(qp, kp) -> bool:
    """A module's columns in both q and k (a norm shared by q and k, a rotary module they both pass)."""
    return any(a is b and bool((c[:, None] == d[None]).any()) for _, a, c in qp for _, b, d in kp)


def _owner(call_module, names):
    """The module the site is named by: the call's attention module (None: none, a block calling an
    attention function), which must hold every part (None otherwise); without one, the module
    the parts share."""
    inside = lambda n, o: o == "" or n.startswith(o + ".")
    if call_module is not None:
        return call_module if all(inside(n, call_module) for n in names) else None
    common = names[0].split(".")[:-1]
    for n in names[1:]:
        b = n.split(".")[:-1]
        i = 0
        while i < min(len(common), len(b)) and common[i] == b[i]:
            i += 1
        common = common[:i]
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
            _hooks(*[(m, lambda m, i, o, n=n: outs.append((n, m, o, _made(m, i, o) == "projection"))
                      if _made(m, i, o) else None) for n, m in _leaves(root)]):
        marks = []
        p.on_call = lambda: marks.append(len(outs))
        try:
            ctx.run(ctx.sample(k=95), grad=True, up_to_calls=True)
        except TargetRaised:   # the target's error is the checks' to report (or it refuses autograd beyond the calls)
            return []
    if p.errors:
        raise DoctorBug(p.errors[0], "the probe") from p.errors[0]
    found, seen = [], {}
    for c, mark in zip(p.calls, marks):
        if c.module in sited or "graph" not in c.extra:
            continue
        q, k = c.extra["graph"]
        for made in (outs[:mark], [f for f in outs[:mark] if f[3]]):   # after a shared norm: the projections
            qp, kp = _frontier(q, made), _frontier(k, made)
            if qp and kp and not _overlap(qp, kp):
                break
        else:
            continue
        owner = _owner(c.module if mods else None, [n for n, _, _ in qp + kp])
        if owner is None or owner in sited:
            continue
        if owner in seen:   # a later call of the same module (differential attention's second map on other
            # head dims): its columns join the site, so that q and k are scaled and measured whole
            i = seen[owner]
            site = found[i][2]
            mq, mk = _merged(site.q_parts, qp), _merged(site.k_parts, kp)
            if not _overlap(mq, mk):
                found[i] = (owner, found[i][1], ColumnSite(owner, found[i][1], mq, mk))
            continue
        seen[owner] = len(found)
        module = root.get_submodule(owner) if owner else root
        found.append((owner, module, ColumnSite(owner, module, qp, kp)))
    return found


def _merged(parts, more):
    """[(name, module, columns)] of parts and more together: a module's columns their union."""
    out = [(n, m, c) for n, m, c in parts]
    for n, m, c in more:
        i = next((j for j, (_, o, _) in enumerate(out) if o is m), None)
        if i is None:
            out.append((n, m, c))
        else:
            out[i] = (out[i][0], m, torch.unique(torch.cat([out[i][2], c])))
    return out
