"""A causal LM called as `forward(ids, ...)`, its conventions found from its forward's parameter
names and by measurement, as people write them:

- logits, `(logits, loss)` or an object with `.logits`; a forward that returns only the last
  position's logits unless given `targets` (nanoGPT) is given targets;
- a padding mask named `attention_mask`, `mask` or another of MASK_NAMES, in the encoding that
  measurably masks (ENCODINGS: 0/1 integers, bool keep- or masked-out masks, additive floats, and
  square masks with the causal part in them);
- positions named `position_ids`, `pos`, `positions` ((B, T) ids), `input_pos` ((T,) after a
  cache set up by `set_kv_cache` or `setup_caches`, LitGPT, gpt-fast; else (B, T) ids, torchtune) or `start_pos` (an int
  offset, Meta's Llama); without any, an nn.Embedding a plain forward feeds 0..T-1 (a learned
  position table) is fed the ids; a forward that raises without input_pos behind setup_caches
  (gpt-fast's model.py) is given both on every plain call (_first_call), and position ids a
  forward requires (no default) are 0..T-1 in a plain call;
- a KV cache driven by `start_pos` (a cache kept inside, written at that offset), by `input_pos`
  after `set_kv_cache(batch_size)` (LitGPT) or `setup_caches(max_batch_size, max_seq_length)`
  (gpt-fast: buffers written in place at a 1-D `input_pos`), or passed back in (`cache=` with `return_intermediates=True`:
  the whole sequence in, the last `cache_age` tokens computed, as x-transformers does); else one
  found by trying (caches.py: a set-up method of another signature, presents returned and passed
  back, a cache object passed in);
- attention paths switched by a boolean `flash` on its modules (nanoGPT, x-transformers), where
  both settings run.

What was found is in `conventions` (the result's info); where nothing is found the check says
which argument would enable it, and an Adapter remains the way in.
"""
import inspect
from contextlib import contextmanager

import torch
import torch.nn as nn

from attention_doctor.adapters import (
    Adapter,
    TargetError,
    Unreachable,
    Unsupported,
    _params,
    _var_kwargs,
    target_scope,
)
from attention_doctor.adapters import _first_output as first_output
from attention_doctor.caches import cache_args, cache_things, find_drive, setup_methods
from attention_doctor.module_state import Snapshot
from attention_doctor.signals import TargetRaised, doctor_hook

MASK_NAMES = ("attention_mask", "mask", "attn_mask", "padding_mask", "key_padding_mask", "src_key_padding_mask",
              "input_mask", "pad_mask")
POSITION_NAMES = ("position_ids", "pos", "positions", "input_pos", "start_pos")
EFFECT = 1e-5   # a mask that moves the real tokens' outputs by more than this (relative) masks


def _causal_keep(m):
    """(B, T, T) bool, True = may attend: the causal part and the real keys (a square mask's rows)."""
    T = m.shape[-1]
    return torch.ones(T, T, dtype=torch.bool, device=m.device).tril()[None] & m[:, None, :]


def _additive(keep, dt):
    return torch.zeros(keep.shape, dtype=dt, device=keep.device).masked_fill(~keep, torch.finfo(dt).min)


ENCODINGS = {   # a (B, T) bool keep-mask as the forward may take it
    "0/1 integers": lambda m, dt: m.long(),
    "bool": lambda m, dt: m,
    "additive (B, T)": lambda m, dt: _additive(m, dt),
    "additive (B, 1, 1, T)": lambda m, dt: _additive(m, dt)[:, None, None, :],
    # PyTorch's key_padding_mask: True = ignore
    "bool, True = masked (B, T)": lambda m, dt: ~m,
    # a square mask with the causal part in it: torchtune's (B, T, T) keep, Megatron's (B, 1, T, T)
    # True = masked out, transformers' 4-D additive one
    "causal bool (B, T, T)": lambda m, dt: _causal_keep(m),
    "causal bool (B, 1, T, T)": lambda m, dt: _causal_keep(m)[:, None],
    "causal bool, True = masked (B, 1, T, T)": lambda m, dt: ~_causal_keep(m)[:, None],
    "causal bool, True = masked (B, T, T)": lambda m, dt: ~_causal_keep(m),
    "causal additive (B, 1, T, T)": lambda m, dt: _additive(_causal_keep(m), dt)[:, None],
}
# what each name usually means, tried first (every other encoding after it)
FIRST = {"attention_mask": "0/1 integers", "mask": "bool", "attn_mask": "bool", "padding_mask": "bool",
         "input_mask": "bool", "pad_mask": "bool", "key_padding_mask": "bool, True = masked (B, T)",
         "src_key_padding_mask": "bool, True = masked (B, T)"}


def token_embedding(module) -> nn.Module | None:
    """The first embedding table (nn.Embedding, or a parallel one with num_embeddings)."""
    for m in module.modules():
        if isinstance(m, nn.Embedding) or (isinstance(getattr(m, "num_embeddings", None), int)
                                           and isinstance(getattr(m, "embedding_dim", None), int)):
            return m
    return None


class CallableLM(Adapter):
    """A causal LM called as forward(ids, ...): the conventions in this module's docstring."""
    kind = "lm"

    def __init__(self, module, name="", vocab_size=None):
        super().__init__(module, name)
        emb = token_embedding(module)
        self.vocab_size = vocab_size or (emb.num_embeddings if emb is not None else None)
        if self.vocab_size is None:
            raise TargetError(f"{self.name}: no embedding table to take the vocabulary size from")
        self.accepts, self.any_kwargs = _params(module.forward), _var_kwargs(module.forward)
        self.mask_name = next((n for n in MASK_NAMES if n in self.accepts), None)
        self.pos_name = next((n for n in POSITION_NAMES if n in self.accepts), None)
        self.targets = False          # the forward returns the last position only unless given targets
        self.mask_encoding = FIRST.get(self.mask_name)
        self.mask_ignored = False     # it takes a mask, and no encoding changes any output: it ignores it
        self.mask_one_row = None      # an encoding that masks one row only (the batch takes mask_encoding)
        self.pos_table = None         # the name of a learned position table fed 0..T-1
        self._paths = []              # "flash=False", "flash=True" where the module has both
        self._broken = {}             # a path whose forward raised when found: its error
        self.cache_setup = self._find_cache_setup()   # how an input_pos cache is set up (None: no way)
        self.cache = self._cache_kind()
        self.drive = None             # a cache found by trying (caches.py): how it is driven
        self._live = None             # what a driven cache's set-up changed in the model, put back before other calls
        self.cache_tried = []         # the ways tried where a cache was seen and none drove it
        self.pos_needed = False       # a plain call needs input_pos behind a fresh cache set-up (_first_call)
        # position ids the forward requires (no default): a plain call gets 0..T-1 in every row
        self.ids_required = self.pos_name in ("position_ids", "pos", "positions") and _required(module.forward, self.pos_name)
        self.conventions = {}

    # -- found once, before the checks -----------------------------------------------------------
    def _cache_kind(self):
        if self.pos_name == "start_pos":
            return "start_pos"
        if self.pos_name == "input_pos" and self.cache_setup is not None:
            return "input_pos"
        if "cache" in self.accepts and "return_intermediates" in self.accepts:
            return "cache"
        return None

    def _find_cache_setup(self):
        """How an input_pos cache is set up: LitGPT's set_kv_cache(batch_size, device, dtype), or
        gpt-fast's setup_caches(max_batch_size, max_seq_length) (None: neither is there)."""
        if hasattr(self.module, "set_kv_cache"):
            return "set_kv_cache"
        setup = getattr(self.module, "setup_caches", None)
        if setup is not None and {"max_batch_size", "max_seq_length"} <= _params(setup):
            return "setup_caches"
        return None

    def _set_up_cache(self, batch, length):
        if self.pos_needed:   # afresh for this batch and length (gpt-fast's keeps a larger one, and writes every row)
            self._teardown()
            self._live = Snapshot(self.module)
            try:
                self._set_up(batch, length)
            finally:
                self._live.capture()
            return
        self._set_up(batch, length)

    def _set_up(self, batch, length):
        if self.cache_setup == "set_kv_cache":
            self.module.set_kv_cache(batch_size=batch, device=self.device, dtype=self.dtype)
        else:   # gpt-fast keeps a larger cache it has; its stale slots lie beyond the positions read
            self.module.setup_caches(max_batch_size=batch, max_seq_length=length)

    @property
    def positions_move_cache(self) -> bool:
        """Positions given by a cache's write offset: keys before it are the cache's (empty) slots."""
        return self.cache in ("start_pos", "input_pos")

    def prepare(self, x):
        """Find, by measurement on x, what the names alone do not say (what the target's forward
        raises is a TargetRaised here, as in the doctor's own calls)."""
        with torch.no_grad(), target_scope(self.module):
            y = first_output(self._first_call(x))
            if y.dim() == 3 and y.shape[1] == 1 and x.shape[1] > 1 and "targets" in self.accepts:
                self.targets = True
                self.conventions["targets"] = "the forward returns the last position's logits unless given targets: given targets"
            if self.pos_name is None:
                self._find_position_table(x)
            if self.cache == "start_pos" and not self._start_pos_caches(x):
                self.cache = None
                self.conventions["start_pos"] = "moves the positions only (no cache behind it)"
            if self.mask_name is not None:
                self._find_mask_encoding(x)
            if self.cache is None and ((setup_methods(self.module) and "input_pos" in self.accepts)
                                       or cache_args(self.accepts)):
                self.drive, self.cache_tried = find_drive(self, x)
                self.cache = "found" if self.drive is not None else None
            self._find_paths(x)
        if self.pos_name:
            self.conventions["positions"] = self.pos_name
        if self.cache:
            self.conventions["cache"] = {"start_pos": "kept inside, written at start_pos",
                                         "input_pos": {"set_kv_cache": "set_kv_cache(batch_size)",
                                                       "setup_caches": "setup_caches(max_batch_size, max_seq_length)"}
                                         .get(self.cache_setup, "") + ", then a 1-D input_pos",
                                         "cache": "cache= with return_intermediates=True",
                                         "found": f"{self.drive.describe() if self.drive else ''} (found by trying: "
                                                  "it runs and the new tokens read the prompt)"}[self.cache]
        elif self.cache_tried:
            self.conventions["cache"] = "none driven: " + "; ".join(self.cache_tried)[:600]

    def _first_call(self, x):
        """The first plain call; where it raises and the forward takes input_pos behind a cache
        set-up (gpt-fast's asserts its caches are set up and indexes its mask by input_pos), the
        call that sets the cache up for the batch and gives input_pos 0..T-1, as its generate does:
        every plain call from then on (pos_needed). Raises what the plain call raised where that
        does not run either."""
        try:
            return self._call(x)
        except TargetRaised as e:
            if self.cache != "input_pos":
                raise
            self.pos_needed = True
            try:
                out = self._call(x)
            except TargetRaised:
                self.pos_needed = False
                self._teardown()
                raise e from None
            self.conventions["plain call"] = (f"{self.cache_setup}(batch, length), then input_pos 0..T-1 (without them "
                                              f"its forward raised: {e.error[:80]})")
            return out

    def _find_position_table(self, x):
        """An embedding (not the token one) that a plain forward feeds 0..T-1: a learned position table."""
        tok = token_embedding(self.module)
        fed = []
        hooks = [m.register_forward_pre_hook(doctor_hook(lambda m, a, n=n: fed.append((n, m, a[0] if a else None))))
                 for n, m in self.module.named_modules() if isinstance(m, nn.Embedding) and m is not tok]
        try:
            self._call(x)
        finally:
            for h in hooks:
                h.remove()
        ramp = torch.arange(x.shape[1], device=x.device)
        for n, m, ids in fed:
            if isinstance(ids, torch.Tensor) and ids.shape[-1] == x.shape[1] and bool((ids == ramp).all()):
                self.pos_table = n
                self.max_len = m.num_embeddings
                self.conventions["positions"] = f"the ids fed to {n} (a position table fed 0..T-1)"
                return

    def _flags(self):
        return [m for m in self.module.modules() if isinstance(getattr(m, "flash", None), bool)]

    def _find_paths(self, x):
        """Both settings of the modules' `flash` switch are paths, where each runs a forward or
        raises for another reason than lacking what the module was built without: a setting
        whose forward reads an attribute the flagged module does not have (nanoGPT registers its
        causal mask buffer only when built without SDPA) is not a path of this module, by nature.
        A setting that raises otherwise stays a path the doctor cannot drive (use_path:
        Unreachable), never dropped."""
        flags = self._flags()
        if not flags:
            return
        runs, broken = [], {}
        for name in ("flash=False", "flash=True"):
            try:
                with self.use_path(name):
                    self._call(x)
                runs.append(name)
            except TargetRaised as e:
                if _built_without(e.__cause__, flags):
                    self.conventions["paths"] = f"{name}: the module was built without it ({e.error[:80]}): one path"
                    return
                broken[name] = e.error
        self._paths, self._broken = ["flash=False", "flash=True"], broken
        self.conventions["paths"] = f"flash on {len(flags)} module(s), both settings" + "".join(
            f"; {n} raises ({err[:80]})" for n, err in broken.items())

    def paths(self):
        return list(self._paths)

    @contextmanager
    def use_path(self, name):
        if name in self._broken:
            raise Unreachable(f"path {name} raises ({self._broken[name][:120]}): the doctor cannot tell a path of this "
                              "module from a setting of its flag it does not support (an Adapter's use_path can)")
        flags = self._flags()
        old = [m.flash for m in flags]
        for m in flags:
            m.flash = name.endswith("True")
        try:
            yield
        finally:
            for m, v in zip(flags, old):
                m.flash = v

    def _start_pos_caches(self, x) -> bool:
        """start_pos drives a cache when the tokens after it read what was written before it."""
        n = x.shape[1] // 2
        outs = []
        for prefix in (x[:, :n], x[:, :n].flip(0)):
            self._call(prefix, start_pos=0)
            outs.append(first_output(self._call(x[:, n:], start_pos=n)))
        return not torch.equal(outs[0], outs[1])

    def _find_mask_encoding(self, x):
        """The first encoding that masks padding, tried at the batch size the checks use: a mask with
        every token real leaves the outputs as they are without one; left padding of row 0 moves its
        real tokens' outputs (their queries no longer read the padding) and leaves row 1, unpadded,
        as it is. An encoding only one row takes right (a (B, T, T) mask that broadcasts at B = 1
        only) is no encoding of the batch. Where none masks a batch, the first that masks one row
        (an unexpanded (B, T) mask broadcasts there: batch_independence then shows the broadcast).
        None does (a mask the target ignores, one of another shape, or a forward that raises under
        every encoding): the target takes a mask the doctor cannot give, and the checks that need
        one are inconclusive."""
        order = [FIRST[self.mask_name]] + [e for e in ENCODINGS if e != FIRST[self.mask_name]]
        if x.shape[0] >= 2:
            found, _, _ = self._mask_trial(x[:2], order)
            if found is not None:
                self.mask_encoding = found
                # an encoding tried before it that masks one row but no batch: a caller's mask of that shape
                # mixes rows or raises at B > 1 (batch_independence and padding warn, naming both)
                self.mask_one_row = self._mask_trial(x[:1], order[:order.index(found)])[0]
                self.conventions["mask"] = f"{self.mask_name} as {found} (found by measurement)"
                return
        found, raised, inert = self._mask_trial(x[:1], order)
        if found is not None:
            self.mask_encoding = found
            self.conventions["mask"] = (f"{self.mask_name} as {found} (found by measurement on one row: no encoding tried "
                                        "masks a batch of two)")
            return
        self.mask_encoding = None
        if inert and inert + len(raised) == len(order):
            # every encoding it ran under left every output as it is: the forward takes a mask and
            # ignores it (a bug, padding's fail, never n/a); the doctor passes it as the first one
            self.mask_ignored, self.mask_encoding = True, order[0]
            self.conventions["mask"] = (f"{self.mask_name}: ignored (under {inert} encoding(s) tried, left padding "
                                        "masked leaves the real tokens' outputs as they are without a mask)")
            return
        if len(raised) == len(order):
            self.conventions["mask"] = (f"{self.mask_name}: its forward raised under every encoding tried "
                                        f"({'; '.join(raised)})")
        else:
            self.conventions["mask"] = (f"{self.mask_name}: no encoding tried ({', '.join(order)}) masks the padding "
                                        "(all real: outputs unchanged; left padding: real outputs moved)"
                                        + (f"; raised: {'; '.join(raised)}" if raised else ""))

    def _mask_trial(self, xs, order):
        """(the first encoding of `order` that masks row 0's left padding of xs and leaves every other
        row as without a mask, or None; what the others raised; how many left every output as it is)."""
        P = xs.shape[1] // 4
        keep = torch.ones_like(xs, dtype=torch.bool)
        plain = first_output(self._call(xs)).double()
        raised, inert = [], 0
        for enc in order:
            keep[:, :P] = True
            try:
                same = _change(first_output(self._call(xs, **{self.mask_name: ENCODINGS[enc](keep, self.dtype)})), plain)
                keep[0, :P] = False
                y = first_output(self._call(xs, **{self.mask_name: ENCODINGS[enc](keep, self.dtype)})).double()
            except TargetRaised as e:   # not this encoding; what it raised is said if none works
                raised.append(f"{enc}: {e.error[:80]}")
                continue
            moved = _change(y[:1, P:], plain[:1, P:])
            others = _change(y[1:], plain[1:]) if xs.shape[0] > 1 else 0.0
            if same <= EFFECT and moved > EFFECT and others <= EFFECT:
                return enc, raised, inert
            inert += same <= EFFECT and moved <= EFFECT
        return None, raised, inert

    # -- the protocol ----------------------------------------------------------------------------
    def _call(self, x, **kw):
        if self.pos_needed and "input_pos" not in kw:   # a cache set up for this call only, put back after it
            self._set_up_cache(x.shape[0], x.shape[1])
            try:
                return self._call(x, **kw, input_pos=torch.arange(x.shape[1], device=x.device))
            finally:
                self._teardown()
        if self.ids_required and self.pos_name not in kw:
            kw[self.pos_name] = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        if self.targets:
            kw["targets"] = x
        if self.cache == "start_pos" or self.pos_name == "start_pos":
            kw.setdefault("start_pos", 0)
        return self.module(x, **kw)

    def end_cache(self):
        self._teardown()

    def _teardown(self):
        """Put back what a driven cache's set-up changed in the model (its cache modules), so that
        a call without the cache runs as the model was built."""
        if self._live is not None:
            self._live.restore()
            self._live = None

    def converted(self, dtype=None, device=None):
        self._teardown()
        return super().converted(dtype=dtype, device=device)

    def forward(self, x, mask=None, positions=None):
        self._teardown()
        kw = {}
        if mask is not None:
            if self.mask_name is None:
                raise Unsupported("needs a padding mask (forward takes neither attention_mask nor mask; "
                                  "an Adapter's forward(x, mask) enables it)", "no_padding_mask")
            if self.mask_encoding is None:   # it takes one: the doctor cannot give it (never n/a)
                raise Unreachable(f"needs a padding mask the doctor can give: {self.conventions.get('mask', '')}; an "
                                  "Adapter's forward(x, mask) can")
            kw[self.mask_name] = ENCODINGS[self.mask_encoding](mask, self.dtype)
        if positions is None:
            return first_output(self._call(x, **kw))
        if self.pos_name in ("position_ids", "pos", "positions") or (self.pos_name == "input_pos" and self.cache != "input_pos"):
            return first_output(self._call(x, **kw, **{self.pos_name: positions}))
        if self.pos_name in ("start_pos", "input_pos"):
            start = uniform_offset(positions)
            if self.pos_name == "start_pos":
                return first_output(self._call(x, **kw, start_pos=start))
            with self._input_pos_cache(x.shape[0], start + x.shape[1]):
                ids = torch.arange(start, start + x.shape[1], device=x.device)
                return first_output(self._call(x, **kw, input_pos=ids))
        if self.pos_table is not None:
            with self._fed(positions):
                return first_output(self._call(x, **kw))
        raise Unsupported("needs positions (forward takes none of " + ", ".join(POSITION_NAMES) +
                          " and no position table is fed 0..T-1)", "no_positions")

    @contextmanager
    def _fed(self, positions):
        table = self.module.get_submodule(self.pos_table)   # this adapter's module (a converted copy's own)
        h = table.register_forward_pre_hook(doctor_hook(lambda m, a: (positions,) + tuple(a[1:])))
        try:
            yield
        finally:
            h.remove()

    @contextmanager
    def _input_pos_cache(self, batch, length):
        """LitGPT, gpt-fast: input_pos needs a cache set up first (LitGPT's a fresh one: its slots
        start empty), holding `length` positions."""
        self._set_up_cache(batch, length)
        try:
            yield
        finally:
            if hasattr(self.module, "clear_kv_cache"):
                self.module.clear_kv_cache()
            if self.pos_needed:
                self._teardown()

    def prefill(self, x):
        T = x.shape[1]
        if self.cache == "start_pos":
            return T, first_output(self._call(x, start_pos=0))
        if self.cache == "input_pos":
            self._set_up_cache(x.shape[0], 2 * T)   # room for the steps after the prefill
            return T, first_output(self._call(x, input_pos=torch.arange(T, device=x.device)))
        if self.cache == "cache":
            out, inter = self._call(x, return_intermediates=True)
            return (x, inter), first_output(out)
        if self.cache == "found":
            self._teardown()
            self._live = Snapshot(self.module)
            state = self.drive.start(x.shape[0], 2 * T, self._live)   # room for the steps after the prefill
            return state, self.drive.call(state, x)
        things = cache_things(self.module, self.accepts)
        if things:   # a cache the doctor sees and cannot drive: inconclusive with what it found, never n/a
            raise Unreachable(f"a cache the doctor cannot drive: {', '.join(things)}"
                              + (f" (tried: {'; '.join(self.cache_tried)[:300]})" if self.cache_tried else "")
                              + "; an Adapter with prefill and step can")
        raise Unsupported("no KV cache (forward takes none of start_pos, input_pos with set_kv_cache or setup_caches, "
                          "cache with return_intermediates; an Adapter with prefill and step enables kv_cache)",
                          "no_kv_cache")

    def step(self, state, x):
        n = x.shape[1]
        if self.cache == "start_pos":
            return state + n, first_output(self._call(x, start_pos=state))
        if self.cache == "input_pos":
            return state + n, first_output(self._call(x, input_pos=torch.arange(state, state + n, device=x.device)))
        if self.cache == "cache":   # the whole sequence in, its last n tokens computed from the cache
            full, inter = state
            outs = []
            ages = [n] if (self.any_kwargs or "cache_age" in self.accepts) else [1] * n
            for i, age in enumerate(ages):
                full = torch.cat([full, x[:, i:i + age]], 1)
                out, inter = self._call(full, cache=inter, return_intermediates=True,
                                        **({"cache_age": age} if age != 1 else {}))
                outs.append(first_output(out)[:, -age:])
            return (full, inter), torch.cat(outs, 1)
        if self.cache == "found":
            return state, self.drive.call(state, x)
        return self.prefill(x)

    def embedding(self):
        return token_embedding(self.module)


def _required(fn, name) -> bool:
    """fn's parameter `name` has no default."""
    try:
        p = inspect.signature(fn).parameters.get(name)
    except (TypeError, ValueError):
        return False
    return p is not None and p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)


def _change(y, ref) -> float:
    """max |y - ref| / max |ref|; inf where y is not finite."""
    y, ref = y.double(), ref.double()
    if not bool(torch.isfinite(y).all()):
        return float("inf")
    return float((y - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def _built_without(e, flags) -> bool:
    """e is an AttributeError raised by looking up an attribute a flagged module does not have
    (nn.Module.__getattr__'s frame, its `self` one of them): the module was built without that path."""
    if not isinstance(e, AttributeError) or e.__traceback__ is None:
        return False
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return any(tb.tb_frame.f_locals.get("self") is m for m in flags)


def uniform_offset(positions) -> int:
    """The one offset of positions that every row counts on from (start_pos / input_pos)."""
    start = int(positions.reshape(-1, positions.shape[-1])[0, 0])
    ramp = torch.arange(start, start + positions.shape[-1], device=positions.device)
    if not bool((positions == ramp).all()):
        raise Unsupported("needs position ids per row (its positions are one offset for every row)", "no_positions")
    return start
