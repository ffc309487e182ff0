"""What every check shares: the context (target, its description, sizes, seeded inputs, the probe,
the one way to call the target), the error measure, the tolerances (docs/doctor.md says why each
is what it is), and the helpers that make a check's row."""
import math
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch

from attention_doctor import measured, mixing
from attention_doctor.adapters import Adapter, call, forget_history
from attention_doctor.layouts import attention_modules, measured_sites
from attention_doctor.probes import Probe
from attention_doctor.result import FAIL, INCONCLUSIVE, NA, PASS, Row
from attention_doctor.score_axes import ambiguous, query_axis, relaid, unmeasured
from attention_doctor.signals import DoctorBug, NotPerformed, Signal, TargetRaised, Unsupported

# float32 tolerances, relative to the largest |output| of the reference (see docs/doctor.md)
EXACT_REL = 1e-6       # same computation, other tokens changed: masked keys contribute exactly 0
AGREE_REL = 1e-5       # the same outputs by another route (cache, batch, padding, path): rounding only
AMP_LO, AMP_HI, AMP_TARGET = 1e4, 1e5, 3e4   # amplified scores: the largest |score| lands here
AMP_MODERATE = 1e3     # low precision: finfo(float16).min + a score below -16 is -inf, q k^T still < 65504
NOISE_MARGIN = 4.0     # a comparison's limit is at least this times the eval calls' own rounding noise
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


def rel(a: torch.Tensor, ref: torch.Tensor, what: str = "the reference") -> float:
    """max |a - ref| / max |ref|, in float64: inf where a is not finite and ref is (a NaN is never
    agreement). A reference that is not finite itself leaves nothing to compare against: the check
    is not performed (NotPerformed, cause reference_nonfinite), never a pass."""
    a, ref = a.double(), ref.double()
    fin = torch.isfinite(ref)
    if not bool(fin.all()):
        raise NotPerformed(f"{what}: not finite ({int((~fin).sum())} of {ref.numel()} values), no comparison holds",
                           "reference_nonfinite")
    if a.shape != ref.shape:   # the target's outputs for one input are (B, T, D) whatever B and T are
        raise NotPerformed(f"outputs of shape {tuple(a.shape)} against {what} of shape {tuple(ref.shape)}",
                           "adapter_contract")
    if not bool(torch.isfinite(a).all()):
        return math.inf
    if ref.numel() == 0:
        return 0.0
    return float((a - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


@dataclass(frozen=True)
class Description:
    """What the checks read about the target, decided once before any check runs (examine(); shown
    in info["description"]), so that a check's outcome is the same alone or in a full run.
    kind: "lm" or "layer"; causal: True / False (None: it could not be decided, causal_from says
    why); causal_from: how it was decided (an LM, the adapter said, or found and how);
    repeatable: two eval calls on one input are bit-identical (eval_dropout reports it); eval_max_diff:
    the largest |difference| between them (inf where they are not finite at the same places);
    rounding: where two calls differed by floating-point reordering, not randomness, their largest
    |difference| (0 otherwise); on several threads where one thread makes them bit-identical (the
    checks then run on one thread, examine() restores the caller's count), or on the checks' threads
    within eval_dropout's reorder limit; noise: that last case's difference relative to the outputs'
    scale, which every comparison's limit then exceeds (Context.limit; 0: bit-identical); shares:
    how two calls that differ on the checks' threads differ (causality.moved; {} where they do not);
    nonfinite / values: how many of the plain forward's output values are NaN or infinite, of how
    many (finite_output reports it); autograd_refused: what the forward raised with autograd on
    where it runs without ("": it runs; FlexAttention on CPU has no backward and refuses): the
    doctor then runs it forward-only, and the gradient halves are inconclusive, naming it."""
    kind: str
    causal: bool | None
    causal_from: str
    repeatable: bool | None
    eval_max_diff: float | None
    nonfinite: int = 0
    values: int = 0
    autograd_refused: str = ""
    rounding: float = 0.0
    noise: float = 0.0
    shares: dict = field(default_factory=dict)


@dataclass
class Context:
    """One examination: the adapter, the inputs' sizes and seed, the target's description, what
    the doctor found out (info), and caches of what depends on the target alone (its attention
    modules, verified q/k sites, the amplifier, unit-variance factors): computed when a check first
    asks, the same whichever check asks first."""
    adapter: Adapter
    B: int = 2
    T: int = 16
    seed: int = 0
    info: dict = field(default_factory=dict)
    description: Description | None = None
    _modules: list | None = None
    cache: dict = field(default_factory=dict)
    undecided: dict = field(default_factory=dict)   # description field -> the signal that kept it undecided

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

    # -- the one way to call the target ---------------------------------------------------------
    def call(self, fn, *args, adapter=None, **kwargs):
        """An adapter member (prefill, step, paths, ...) called as adapters.call does: what the
        target's forward raises is TargetRaised, what the adapter's code raises is inconclusive."""
        return call(adapter or self.adapter, fn, *args, **kwargs)

    def run(self, x, mask=None, positions=None, grad=False, adapter=None, up_to_calls=False):
        """The target's output (B, T, D) (adapters.call: the target's exceptions are TargetRaised,
        signals pass through). With grad, the autograd history the target keeps from earlier
        calls is cut first (adapters.forget_history); a forward that refuses autograd runs
        without, unless up_to_calls: a keep_graph probe runs the attention calls that refuse it on
        detached inputs, and the graph up to their q and k is what the caller wants."""
        a = adapter or self.adapter
        if a.kind == "layer" and x.is_floating_point():
            x = x.to(a.dtype)
        if mask is not None and a.kind == "lm" and a.pad_id is not None:   # padded as a tokenizer pads
            x = x.masked_fill(~mask, a.pad_id)
        if grad and not up_to_calls and self.description is not None and self.description.autograd_refused:
            grad = False   # a forward-only target: run as it can run (the gradient halves say so)
        if grad:
            forget_history(a.module)
        with (nullcontext() if grad else torch.no_grad()):
            return call(a, a.forward, x, mask=mask, positions=positions)

    @contextmanager
    def use_path(self, name, adapter=None):
        """The adapter's use_path(name), entered and left as adapters.call calls it."""
        a = adapter or self.adapter
        cm = call(a, a.use_path, name)
        call(a, cm.__enter__)
        try:
            yield
        finally:
            call(a, cm.__exit__, None, None, None)

    def probe(self, x, mask=None, positions=None, qk_factor=None, adapter=None, modules=None,
              qk_where=None, qk_matmuls=(), keep_graph=False):
        """(output, the attention calls seen) of one forward. It runs with autograd on, as
        training does: a fused inference-only path (nn.MultiheadAttention's fast path under
        no_grad) shows nothing; its black-box checks run it, its white-box checks see the other.
        What the probe's own code raised (a doctor bug) is a DoctorBug after the forward. keep_graph:
        each call keeps its q and k with their autograd history (Probe's)."""
        mods = [(n, m) for n, m, _ in (self.modules_of(adapter) if modules is None else modules)]
        with Probe(mods, qk_factor=qk_factor, qk_where=qk_where, qk_matmuls=qk_matmuls, keep_graph=keep_graph) as p:
            out = self.run(x, mask, positions, adapter=adapter, grad=True)
        if p.errors:
            raise DoctorBug(p.errors[0], "the probe") from p.errors[0]
        return out.detach(), self._measured_layouts(p.calls, adapter)

    def _measured_layouts(self, calls, adapter=None):
        """The calls with each traced call's query axis where measuring put it (score_axes.py),
        measured once on a causal target's plain forward (calls matched by their order)."""
        if self.description is None or not self.description.causal or self.T < 3:
            return calls
        if "query_axes" not in self.cache:
            self.cache["query_axes"] = {}   # while measuring: the probes below read the calls as they are
            self.cache["query_axes"] = self._query_axes()
        axes = self.cache["query_axes"]
        for i, c in enumerate(calls):
            axis = axes.get(i)
            if axis is not None and c.scores is not None and c.scores.dim() == axis[1] and c.dim == -1:
                if axis[0] is None:   # not read in an assumed layout: the checks that need it say so
                    unmeasured(c)
                else:
                    relaid(c, axis[0])
        return calls

    def _query_axes(self) -> dict:
        """{call index: (query axis, scores' ndim)} for the traced calls whose queries are not on the
        axis before the keys, measured on a batch of two with row 0's last token changed; the axis
        None where more than one axis could hold them and none was measured to."""
        x = self.sample(B=2, k=60)
        x2 = x.clone()
        if x.is_floating_point():
            x2[0, -1] = self.sample(B=2, k=61)[0, -1]
        else:
            vocab = getattr(self.adapter, "vocab_size", None) or int(x.max()) + 2
            x2[0, -1] = (x[0, -1] + 1) % vocab
        try:
            _, c1 = self.probe(x)
            _, c2 = self.probe(x2)
        except Signal:   # the checks that probe say what it raised
            return {}
        if len(c1) != len(c2):
            return {}
        out = {}
        for i, (a, b) in enumerate(zip(c1, c2)):
            if a.traced and a.scores is not None and b.scores is not None and a.dim == -1:
                axis = query_axis(a.scores, b.scores, self.T)
                if axis is not None and axis != -2 or axis is None and len(ambiguous(a.scores, self.T)) > 1:
                    out[i] = (axis, a.scores.dim())
        return out

    def mixing(self) -> mixing.Mixing:
        """What a plain forward dispatches (mixing.py: attention weights anywhere, or an op the
        doctor cannot look into), computed once. A forward that raises under the watch rules
        nothing out."""
        if "mixing" not in self.cache:
            x = self.sample(T=mixing.LENGTH, k=50)
            try:
                self.cache["mixing"] = mixing.watched(lambda: self.run(x), mixing.LENGTH)
            except (Exception, TargetRaised) as e:  # noqa: BLE001 -- the watch could not run: attention not ruled out (the check stays inconclusive)
                self.cache["mixing"] = mixing.Mixing("", f"the forward under the watch ({type(e).__name__})", 0)
        return self.cache["mixing"]

    def unseen(self, why: str, cause: str = "scores_unseen") -> Signal:
        """What a check that needs an attention call says where the probe saw none (raise it):
        n/a where the forward has no attention weights at all (a state-space or recurrent mixer:
        the check's interface does not exist), else inconclusive, `why`."""
        m = self.mixing()
        if m.none:
            return Unsupported(f"no attention weights in its forward ({m.said()})", "no_attention")
        return NotPerformed(why, cause)

    # -- the description, decided before the checks --------------------------------------------
    def require_repeatable(self):
        """A check that compares outputs needs them repeatable: NotPerformed (not_repeatable) if not."""
        d = self.description
        if d.repeatable is None:
            raise self.undecided["repeatable"]
        if not d.repeatable:
            raise NotPerformed("eval outputs are not repeatable (see eval_dropout)", "not_repeatable")

    def limit(self, base: float) -> float:
        """A comparison's limit: `base`, or NOISE_MARGIN times the rounding noise two eval calls keep
        on the checks' threads (Description.noise), whichever is larger: no comparison is held
        tighter than the target repeats itself."""
        d = self.description
        return max(base, NOISE_MARGIN * d.noise) if d is not None else base

    def require_causal(self) -> bool:
        """The description's causal; where it could not be decided, what kept it undecided."""
        if self.description.causal is None:
            raise self.undecided["causal"]
        return self.description.causal

    def left_padded(self, pad: int | None = None, k: int = 7):
        """(x, mask): row 0 with `pad` padding tokens on the left, row 1 without."""
        pad = self.T // 4 if pad is None else pad
        x = self.sample(2, self.T, k)
        mask = torch.ones(2, self.T, dtype=torch.bool, device=self.adapter.device)
        mask[0, :pad] = False
        return x, mask


def _number(x):
    return float(x) if isinstance(x, torch.Tensor) else x


def row(outcome, measured=None, tolerance="", detail="", cause="", **measurements) -> Row:
    """A check's row with what it measured (examine adds the check's name, experiment and thread
    from its record). outcome: pass, fail or warn (a fail and a warn name their cause);
    measurements: the named values its record declares."""
    return Row("", outcome, "", cause, _number(measured), tolerance, measurements, detail=detail)


def judged(bad: bool, measured, tolerance, detail, cause="", **measurements) -> Row:
    """fail with `cause` when bad, else pass."""
    return row(FAIL if bad else PASS, measured, tolerance, detail, cause if bad else "", **measurements)


def na(why, cause) -> Row:
    """`n/a: why`: the target cannot have this failure or lacks the interface by nature; `why`
    says what would enable the check."""
    return Row("", NA, why, cause)


def inconclusive(why, cause, measured=None, tolerance="", detail="", **measurements) -> Row:
    """`inconclusive: why`: the check applies, or may apply, but the doctor could not perform it.
    Never a pass: exit code 3, and assert_healthy raises."""
    return Row("", INCONCLUSIVE, why, cause, _number(measured), tolerance, measurements, detail=detail)


def held_in_part(r: Row, not_run: dict) -> Row:
    """r, a check's row from the parts that ran, where the parts in `not_run` ({part: why}) could
    not: a fail stands (what ran found it); anything else is inconclusive naming the parts, never
    a pass. The row keeps what ran in its measurements (`not_run`: the parts)."""
    if not not_run:
        return r
    r.measurements["not_run"] = sorted(not_run)
    if r.outcome is FAIL:
        return r
    why = "; ".join(f"{part} could not run ({reason})" for part, reason in not_run.items())
    return Row("", INCONCLUSIVE, why, "part_not_run", r.measured, r.tolerance, r.measurements, detail=r.detail)


def applied_mask(call, other) -> torch.Tensor | None:
    """The keys the product with the values gave weight to, where it took other weights than the
    softmax's (probes: applied_weights) and their zeros are a mask: the same zeros on other tokens
    (`other`: the same call on them), as a window or an own key dropped after the softmax leaves.
    None where the product took the softmax's weights, where the other call is not comparable, or
    where the zeros move with the tokens: hard attention's one-hot argmax chooses a key, it masks none."""
    applied = call.extra.get("applied_weights")
    again = other.extra.get("applied_weights") if other is not None else None
    if applied is None or again is None or again.shape != applied.shape:
        return None
    return applied != 0 if torch.equal(applied == 0, again == 0) else None


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
    """The largest finite |entry| (0 without one): a calibration (how far to amplify), never an
    error measure."""
    t = t[torch.isfinite(t)]
    return float(t.abs().max()) if t.numel() else 0.0
