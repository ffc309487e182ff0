"""What every check shares: the context (target, sizes, seeded inputs, the probe), the error
measure, and the tolerances (docs/doctor.md says why each is what it is)."""
import math
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from attention_doctor import measured
from attention_doctor.adapters import Adapter, Unreachable, Unsupported
from attention_doctor.layouts import attention_modules, measured_sites
from attention_doctor.probes import MASKED, Probe
from attention_doctor.result import Row

# float32 tolerances, relative to the largest |output| of the reference (see docs/doctor.md)
EXACT_REL = 1e-6       # same computation, other tokens changed: masked keys contribute exactly 0
AGREE_REL = 1e-5       # the same outputs by another route (cache, batch, padding, path): rounding only
AMP_LO, AMP_HI, AMP_TARGET = 1e4, 1e5, 3e4   # amplified scores: the largest |score| lands here
AMP_MODERATE = 1e3     # low precision: finfo(float16).min + a score below -16 is -inf, q k^T still < 65504
HULL_REL = 1e-5        # an output may leave its values' range by rounding only
ROW_SUM_TOL = 1e-3     # weights of a row sum to 1
LOW_PRECISION_RATIO = 2.0   # FlashAttention's rule: at most twice the reference attention's error
SCALE_BAND = (0.5, 2.0)     # score std for unit-variance q, k; a missing 1/sqrt(d_k) gives sqrt(d_k)
ABSOLUTE_POS = 0.05    # outputs at positions +16 differing more than this: absolute positions
# long positions, measured on healthy targets (this project's rope LM; transformers' llama, gemma,
# mistral, qwen2, gpt2, phi, gpt_neox, olmo; seeds 0-2): float32 shift error 1.4e-7..7.1e-6 (the
# bf16-phase failure value: 0.10..0.14); bfloat16 error at +4096 / at +0: 0.69..1.66, never above
# 2x + 0.005 (Llama 4.38.1 under autocast: 49x, Gemma 4.38.1: 7x)
LONG_REL = 1e-3        # float32, unit-variance q, k: outputs at +4096 against +0 (translation-invariant targets)
LONG_BF16_RATIO, LONG_BF16_FLOOR = 2.0, 0.005   # bfloat16 error at +4096 within 2x that at +0, plus a floor
LONG_OFFSET = 4096


def _scaled_by(a, b, f: float) -> bool:
    """Call b's q k^T is f times call a's (f = 1: q and k are normalised after the site)."""
    qa = a.q.double() @ a.k.double().transpose(-2, -1)
    qb = b.q.double() @ b.k.double().transpose(-2, -1)
    return float((qb - f * qa).abs().max()) <= 1e-4 * max(float(qa.abs().max()), 1e-30)


class TargetRaised(Exception):
    """The target's forward raised on an input the check gave it (a valid one)."""


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    """max |a - ref| / max |ref|; inf when a is not finite where ref is."""
    a, ref = a.double(), ref.double()
    if not torch.isfinite(a[torch.isfinite(ref)]).all():
        return math.inf
    d = (a - ref)[torch.isfinite(ref)].abs()
    if d.numel() == 0:
        return 0.0
    return float(d.max() / ref[torch.isfinite(ref)].abs().max().clamp_min(1e-30))


@dataclass
class Context:
    adapter: Adapter
    B: int = 2
    T: int = 16
    seed: int = 0
    info: dict = field(default_factory=dict)
    deterministic: bool | None = None
    causal: bool | None = None
    _modules: list | None = None
    _amp: object = None
    cache: dict = field(default_factory=dict)

    def gen(self, k: int = 0) -> torch.Generator:
        return torch.Generator().manual_seed(1000 * self.seed + k)

    def sample(self, B=None, T=None, k=0):
        return self.adapter.sample(B or self.B, T or self.T, self.gen(k))

    @property
    def modules(self):
        """(name, module, site) of the target's attention modules (layouts.attention_modules, and
        the sites measured.py finds for calls without a verified one)."""
        if self._modules is None:
            self._modules = attention_modules(self.adapter.module)
        return self._modules

    def modules_of(self, adapter=None):
        """The attention modules of the target, or of a converted copy of it (the same names)."""
        if adapter is None or adapter is self.adapter:
            return self.modules
        root = adapter.module
        return [(n, root.get_submodule(n) if n else root, None if s is None else s.on(root)) for n, _, s in self.modules]

    def sites(self, adapter=None):
        """The q/k sites of the target's attention modules whose layout was verified: scaling
        one site's q by 2 must double q k^T in that module's calls, exactly. A site whose calls
        show no q and k cannot be verified and is kept; one that fails is dropped (and named in
        info), and so is one whose module a plain forward never calls. Calls in modules left
        without a site get one measured (measured.py), verified the same way. adapter: a
        converted copy of the target (its sites are found by name)."""
        if "sites" not in self.cache:
            ok, weak = self._verified([s for _, _, s in self.modules if s is not None])
            found = measured.find(self, ok - weak)
            new, new_weak = self._verified([s for _, _, s in found])
            # a measured site replaces a registry one only where it scales the scores and that one did not
            found = [f for f in found if f[0] in new and (f[0] not in weak or f[0] not in new_weak)]
            if found:
                names = {n for n, _, _ in found}
                self._modules = [f for f in self.modules if f[0] not in names] + found
                order = {n: i for i, (n, _) in enumerate(self.adapter.module.named_modules())}
                self._modules.sort(key=lambda f: order[f[0]])
                ok |= names
                self.info["qk_sites_measured"] = sorted(names)
            self.cache["sites"] = ok
        names = self.cache["sites"]
        return [s for _, _, s in self.modules_of(adapter) if s is not None and s.name in names]

    def _verified(self, sites) -> tuple[set, set]:
        """(the sites that hold, those of them whose scaling left q k^T as it was: normalised after)."""
        if not sites:
            return set(), set()
        x = self.sample(k=90)
        ran = {}
        with measured_sites(sites, ran):
            _, base = self.probe(x)
        ok, weak = set(), set()
        for site in sites:
            if not ran.get(site.name):   # its q and k never made by a forward (a decoder's cross-attention, fused q|k|v)
                self.info.setdefault("qk_sites_not_called", []).append(site.name)
                continue
            mine = [c for c in base if c.module == site.name and c.q is not None and c.k is not None]
            if not mine:
                ok.add(site.name)
                continue
            with site.scaled(2.0, 1.0):
                _, calls = self.probe(x)
            twice = [c for c in calls if c.module == site.name and c.q is not None and c.k is not None]
            # the first call only: a module called again in the same forward (looped, weight-tied
            # layers) takes an input its own scaled output changed
            good = len(twice) == len(mine) and (_scaled_by(mine[0], twice[0], 2.0) or _scaled_by(mine[0], twice[0], 1.0))
            if good:
                ok.add(site.name)
                if not _scaled_by(mine[0], twice[0], 2.0):
                    weak.add(site.name)
            else:
                self.info.setdefault("qk_sites_rejected", []).append(site.name)
        return ok, weak

    def run(self, x, mask=None, positions=None, grad=False, adapter=None):
        """The target's output (B, T, D); Unsupported passes through, anything else the target
        raises is TargetRaised."""
        a = adapter or self.adapter
        if a.kind == "layer" and x.is_floating_point():
            x = x.to(a.dtype)
        if mask is not None and a.kind == "lm" and a.pad_id is not None:   # padded as a tokenizer pads
            x = x.masked_fill(~mask, a.pad_id)
        with (nullcontext() if grad else torch.no_grad()):
            try:
                return a.forward(x, mask=mask, positions=positions)
            except Unsupported:
                raise
            except Exception as e:
                raise TargetRaised(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]) from e

    def probe(self, x, mask=None, positions=None, qk_factor=None, adapter=None, modules=None,
              qk_where=None, qk_matmuls=()):
        """(output, the attention calls seen) of one forward. It runs with autograd on, as
        training does: a fused inference-only path (nn.MultiheadAttention's fast path under
        no_grad) shows nothing; its black-box checks run it, its white-box checks see the other."""
        mods = [(n, m) for n, m, _ in (self.modules_of(adapter) if modules is None else modules)]
        with Probe(mods, qk_factor=qk_factor, qk_where=qk_where, qk_matmuls=qk_matmuls) as p:
            out = self.run(x, mask, positions, adapter=adapter, grad=True)
        if p.errors:
            raise RuntimeError(f"probe: {p.errors[0]}")
        return out.detach(), p.calls

    def left_padded(self, pad: int | None = None, k: int = 7):
        """(x, mask): row 0 with `pad` padding tokens on the left, row 1 without."""
        pad = self.T // 4 if pad is None else pad
        x = self.sample(2, self.T, k)
        mask = torch.ones(2, self.T, dtype=torch.bool, device=self.adapter.device)
        mask[0, :pad] = False
        return x, mask


def row(name, verdict, measured=None, tolerance="", detail="", cause="") -> Row:
    """A check's row (examine adds the experiment and thread from the check's record)."""
    if isinstance(measured, torch.Tensor):
        measured = float(measured)
    return Row(name, verdict, measured, tolerance, detail=detail, cause=cause)


# Why a check could not run, for every check alike (a check's own causes are in its record)
COMMON_CAUSES = {
    "target_raised": "fail: the target raised on a valid input the check gave it",
    "doctor_error": "inconclusive: the doctor's own code raised (a doctor bug; strict=True re-raises it)",
    "not_repeatable": "inconclusive: eval outputs differ from call to call (eval_dropout failed), so no comparison holds",
    "scores_unseen": "inconclusive: no attention call was seen (no softmax or SDPA call; einsum with its own "
                     "softmax, a fused kernel): the scores, weights or q and k it needs are out of sight",
    "not_amplified": "inconclusive: scaling q and k did not raise the scores (normalised or capped scores, or a "
                     "q/k layout read wrong)",
    "no_qk_layout": "inconclusive: no verified q/k layout (attention_doctor/layouts.py): q and k cannot be made "
                    "unit-variance where they are made",
    "unreachable": "inconclusive: the target may have the interface (a cache of its own kind, positions it "
                   "rejects) but the doctor cannot drive it; an Adapter can",
    "part_not_run": "inconclusive: the part that ran held, another part of the check could not run",
    "adapter_contract": "inconclusive: an adapter returned something its contract does not allow",
}


def na(name, why) -> Row:
    """`n/a: why`: the target cannot have this failure or lacks the interface by nature; `why`
    says what would enable the check."""
    return row(name, f"n/a: {why}")


def inconclusive(name, why, cause="", measured=None, tolerance="", detail="") -> Row:
    """`inconclusive: why`: the check applies, or may apply, but the doctor could not perform it.
    Never a pass: exit code 3, and assert_healthy raises."""
    return row(name, f"inconclusive: {why}", measured, tolerance, detail, cause)


def unsupported(name, e: Unsupported) -> Row:
    """The row for an Unsupported the target's adapter raised: n/a (it lacks the capability by
    nature), or inconclusive for an Unreachable (it may have it; the doctor cannot drive it)."""
    if isinstance(e, Unreachable):
        return inconclusive(name, str(e), "unreachable")
    return na(name, str(e))


def not_repeatable(name) -> Row:
    return inconclusive(name, "eval outputs are not repeatable (see eval_dropout)", "not_repeatable")


def unseen(name, why) -> Row:
    """The doctor saw no attention call where the check needs one."""
    return inconclusive(name, why, "scores_unseen")


def visible_scores(call) -> torch.Tensor:
    """The scores of a call at its visible entries, float64 (q k^T * scale where q, k are known;
    a hand-made normalisation's q k^T times the scale fitted to its exp, or as it is without one)."""
    if call.q is not None and call.k is not None and (call.source == "handmade" or (
            call.scale is not None and call.source != "softmax")):
        s = call.raw()
        if call.bias is not None:
            s = s + call.bias.double()
    else:
        s = call.scores.double()
    vis = call.visible
    if vis is None:
        return s.flatten()
    return s.masked_select(vis.expand_as(s))


def finite_max_abs(t: torch.Tensor) -> float:
    t = t[torch.isfinite(t)]
    return float(t.abs().max()) if t.numel() else 0.0
