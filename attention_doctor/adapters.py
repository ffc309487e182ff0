"""The adapter protocol: everything the doctor calls on a target, and the adapters built in.

A target is driven through an `Adapter`. Inputs are token ids (B, T) for a language model
(`kind = "lm"`) or vectors (B, T, C) for a layer (`kind = "layer"`); the output is (B, T, D)
floats (logits, or the layer's output). Masks are (B, T) bool, True on real tokens; positions
are (B, T) long. A capability the target lacks by nature raises `Unsupported(why)`: the checks
that need it say `n/a: why`; one it may have but the doctor cannot drive raises
`Unreachable(why)`: they say `inconclusive: why`. Neither is ever a pass (both are signals,
attention_doctor/signals.py: no `except Exception` swallows them). The doctor calls an adapter
inside `target_scope`: what the target's own forward raises fails the check (`target_raised`); what
the adapter's code around it raises is `inconclusive` (a built-in adapter's: `doctor_error`, a
user's: `adapter_error`). Built in: `Layer`,
`TorchMHA` here, `CallableLM` (conventions.py), `HFCausalLM` (hf.py). docs/doctor.md has the
protocol and a worked example.
"""
import copy
import copyreg
import functools
import inspect
import types
from contextlib import contextmanager

import torch
import torch.nn as nn

from attention_doctor.signals import (  # noqa: F401
    AdapterError,
    DoctorBug,
    Signal,
    TargetError,
    TargetRaised,
    Unreachable,
    Unsupported,
)
from attention_doctor.windows import declared_windows, layer_names, module_config


class Adapter:
    """How the doctor drives a target: subclass it for a target it does not know, set `kind`,
    `causal`, `vocab_size` (an LM) or `d_model` (a layer), implement `forward`, and the optional
    members the target has (docs/doctor.md, "The adapter protocol"). `examine(MyAdapter(module))`
    and `attention-doctor pkg.mod:factory` (a factory returning it) both take one."""
    kind = "lm"                # "lm": ids in, logits out | "layer": (B, T, C) in, (B, T, C) out
    causal: bool | None = True  # a layer may say None: the doctor finds out and reports it
    max_len: int | None = None  # the longest position the target accepts (None: no limit known)
    pad_id: int | None = None   # an LM's padding token: padded positions hold it (RoBERTa counts positions by it)
    positions_move_cache = False  # positions are a cache's write offset (keys before it: the cache's slots)
    cross = False              # cross-attention: the keys are another sequence's (no query has a key of its own)

    def __init__(self, module: nn.Module, name: str = ""):
        self.module = module
        self.name = name or type(module).__name__

    @property
    def implementation(self) -> str | None:
        """The attention implementation the target runs now, as the target names it (transformers'
        `_attn_implementation`, this project's backend); None when it names none."""
        return None

    # -- required ----------------------------------------------------------------------------
    def forward(self, x, mask=None, positions=None) -> torch.Tensor:
        """(B, T, D) floats for inputs x; mask (B, T) bool True = real token; positions (B, T)."""
        raise NotImplementedError

    def sample(self, B: int, T: int, gen: torch.Generator) -> torch.Tensor:
        """Random inputs on the module's device: ids for an LM, N(0, 1) vectors for a layer."""
        dev = self.device
        if self.kind == "lm":
            return torch.randint(0, self.vocab_size, (B, T), generator=gen).to(dev)
        return torch.randn(B, T, self.d_model, generator=gen).to(dev, self.dtype)

    # -- optional ----------------------------------------------------------------------------
    def prepare(self, x):
        """Called once before the checks with a sample input: find what the target's names do not
        say (conventions.py measures its mask encoding, position table, cache). Nothing by default."""

    def prefill(self, x):
        """Run x (B, T) with a fresh cache: (state, output (B, T, D)). A cache the target lacks:
        Unsupported; one it has but this adapter cannot drive: Unreachable."""
        raise Unsupported("needs a KV cache (an Adapter with prefill and step)", "no_kv_cache")

    def step(self, state, x):
        """Run the new tokens x (B, T_new) after `state`: (state, output for the new tokens only,
        (B, T_new, D)). The doctor steps each state once: `step` may update the state in place
        (transformers' caches do) and need not accept a state stepped before; every trial starts
        from a fresh `prefill`."""
        raise Unsupported("needs a KV cache (an Adapter with prefill and step)", "no_kv_cache")

    def paths(self) -> list[str]:
        """Names of the target's switchable attention paths (e.g. eager, sdpa); [] if none."""
        return []

    @contextmanager
    def use_path(self, name: str):
        """A context in which the target runs attention path `name` (one of paths())."""
        raise Unsupported("no switch between attention paths", "no_paths")
        yield

    def windows(self) -> tuple[int, list[bool | str | None] | None]:
        """The sliding window the target declares: (its size in keys, per layer in the order they
        run whether that layer slides: True, False for full attention, None for a layer that is no
        softmax attention: linear attention, a convolution; a string naming an attention kind of the
        target's own, whose calls are counted but whose window is not judged; or None for all of
        them: a window the target names without saying which layers take it, read from the calls).
        A target that declares none: Unsupported. By default what the module's own `config` declares
        (windows.py: transformers' field names, or window_size)."""
        cfg = module_config(self.module)
        if cfg is None:
            raise Unsupported("declares no sliding window (an Adapter's windows() declares one)", "no_window")
        return declared_windows(cfg)

    def window_layers(self) -> list[str] | None:
        """The module name (as named_modules() gives it) of each layer windows() declares, in its
        order: a call made inside a layer's module is that layer's, however many times the layer runs
        (a recurrent-depth model loops some); None where not known (the calls are then taken in
        layer order). By default the one ModuleList with as many layers as windows() declares."""
        _, layers = self.windows()
        return None if layers is None else layer_names(self.module, len(layers))

    @contextmanager
    def reloaded(self):
        """A context that yields an Adapter of the target saved and loaded back (its own save and
        load, e.g. save_pretrained / from_pretrained into a temporary directory). None by default."""
        raise Unsupported("no save and load (an Adapter's reloaded() enables it)", "no_save_load")
        yield

    def embedding(self) -> nn.Module | None:
        """An LM's input embedding (its output is what gradients are taken against)."""
        for m in self.module.modules():
            if isinstance(m, nn.Embedding):
                return m
        return None

    # -- derived -----------------------------------------------------------------------------
    @property
    def device(self):
        """The device of the module's first parameter (cpu without parameters)."""
        p = next(self.module.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    @property
    def dtype(self):
        """The dtype of the module's first floating parameter (float32 without one)."""
        p = next((p for p in self.module.parameters() if p.is_floating_point()), None)
        return p.dtype if p is not None else torch.float32

    def converted(self, dtype=None, device=None) -> "Adapter":
        """A copy of this adapter on a deep copy of the module, moved to dtype / device."""
        new = copy.copy(self)
        new.module = moved(deep_copy(self.module), device=device, dtype=dtype)
        return new


def moved(module: nn.Module, device=None, dtype=None) -> nn.Module:
    """module.to(device, dtype), but the dtype only for floating tensors: nn.Module.to casts a
    complex buffer to a real dtype by dropping its imaginary part (torchtitan's complex64
    `freqs_cis` would scale instead of rotate), so complex (and integer, bool) tensors keep their
    dtype and only move."""
    return module._apply(lambda t: t.to(device=device, dtype=dtype if t.is_floating_point() else None))


def deep_copy(module: nn.Module) -> nn.Module:
    """copy.deepcopy, and what it leaves shared: tensors modules keep as plain attributes (the last
    attention weights, a KV cache written in a forward) are copied detached, since deepcopy refuses
    a tensor with autograd history (or one made in inference mode); functions kept as attributes
    that close over the module's own parts (minGPT's `mlpf` lambda) are rebound to the copy's."""
    memo = {id(v): v.detach().clone() for m in module.modules() for v in vars(m).values()
            if isinstance(v, torch.Tensor) and not isinstance(v, nn.Parameter)}
    # and buffers written in place under autograd (gpt-fast's KVCache: index_copy_ of k into its buffer)
    memo.update({id(v): v.detach().clone() for m in module.modules() for v in m._buffers.values()
                 if v is not None and (v.grad_fn is not None or v.is_inference())})
    with _bare_new(module):
        new = copy.deepcopy(module, memo)
    for old_m, new_m in zip(module.modules(), new.modules()):
        for k, f in vars(old_m).items():
            if isinstance(f, types.FunctionType) and f.__closure__:
                cells = tuple(types.CellType(memo.get(id(c.cell_contents), c.cell_contents)) for c in f.__closure__)
                setattr(new_m, k, types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, cells))
    return new


def builtin(adapter) -> bool:
    """The adapter is one of the doctor's own (its code is the doctor's), not a user's subclass."""
    return type(adapter).__module__.split(".")[0] == "attention_doctor"


@contextmanager
def target_scope(module: nn.Module):
    """While the block runs, what the target's own forward raises is a TargetRaised: its forward is
    wrapped (an attribute of the instance, removed after). The doctor's signals pass through
    unchanged (a probe's or a hook's DoctorBug), and so does a TypeError of the call itself (the
    caller passed an argument the forward does not take: the adapter's fault). Already inside
    one: a no-op. A module whose forward cannot be replaced (a ScriptModule) yields False, and its
    caller reads every exception as the target's, as before this wrapper."""
    fwd = module.forward
    if getattr(fwd, "_doctor_target", False):
        yield True
        return

    @functools.wraps(fwd)
    def forward(*args, **kwargs):
        try:
            return fwd(*args, **kwargs)
        except Signal:
            raise
        except Exception as e:  # noqa: BLE001 -- raised inside the target's forward: TargetRaised (fail: target_raised)
            if isinstance(e, TypeError) and e.__traceback__.tb_next is None:   # binding the arguments failed
                raise
            raise TargetRaised(e) from e
    forward._doctor_target = True
    own = module.__dict__.get("forward", None)
    try:
        object.__setattr__(module, "forward", forward)
    except (AttributeError, TypeError, RuntimeError):   # a ScriptModule's forward is not an attribute to set
        yield False
        return
    try:
        yield True
    finally:
        if own is None:
            module.__dict__.pop("forward", None)
        else:
            object.__setattr__(module, "forward", own)


def call(adapter, fn, *args, **kwargs):
    """fn(*args, **kwargs), a member of `adapter` (forward, prefill, step, prepare, a path's
    context), with what raised sorted by whose code it was: the target's forward -> TargetRaised;
    a signal -> as it is; the adapter's own code around the target -> DoctorBug for a built-in
    adapter (a doctor bug), AdapterError for a user's."""
    with target_scope(adapter.module) as wrapped:
        try:
            return fn(*args, **kwargs)
        except Signal:
            raise
        except Exception as e:  # noqa: BLE001 -- the adapter's own code raised: inconclusive (doctor_error or adapter_error), never the target's
            if not wrapped:
                raise TargetRaised(e) from e
            where = getattr(fn, "__qualname__", "")
            raise (DoctorBug(e, where) if builtin(adapter) else AdapterError(e, where)) from e


def forget_history(module: nn.Module):
    """Cut the autograd history of the tensors a module keeps between calls (a KV cache written in
    a forward with autograd on, the last attention weights): a backward through this forward must
    not reach a graph an earlier call of the doctor left and freed ("backward through the graph a
    second time"). The values are unchanged (detach shares the storage)."""
    for m in module.modules():
        for k, v in list(vars(m).items()):
            if isinstance(v, torch.Tensor) and not isinstance(v, nn.Parameter) and v.grad_fn is not None:
                object.__setattr__(m, k, v.detach())
        for k, v in list(m._buffers.items()):
            if v is not None and v.grad_fn is not None:
                m._buffers[k] = v.detach()


def _new_bare(cls):
    return object.__new__(cls)


@contextmanager
def _bare_new(module: nn.Module):
    """While deepcopy runs: the module classes whose own __new__ takes arguments (x-transformers'
    LoRALinear, whose __new__ may return another class) are rebuilt without calling it, from
    object.__new__ and their state, as pickling cannot (copyreg's table, restored after)."""
    classes = {type(m) for m in module.modules() if type(m).__new__ is not object.__new__}
    saved = {c: copyreg.dispatch_table.get(c) for c in classes}
    for c in classes:
        copyreg.dispatch_table[c] = lambda m: (_new_bare, (type(m),), m.__getstate__() if hasattr(m, "__getstate__") else vars(m))
    try:
        yield
    finally:
        for c, old in saved.items():
            if old is None:
                copyreg.dispatch_table.pop(c, None)
            else:
                copyreg.dispatch_table[c] = old


def _first_output(out):
    """logits from logits, (logits, loss), or an object with .logits (HF's ModelOutput)."""
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


# forward arguments that carry a cache (transformers' names, nanoGPT forks', recurrent states)
CACHE_ARGS = {"past_key_values", "past_key_value", "layer_past", "cache", "kv_cache", "use_cache", "cache_params",
              "state", "mems", "past_buckets_states", "past"}


def _params(fn) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _var_kwargs(fn) -> bool:
    """fn takes **kwargs."""
    try:
        return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False


class Layer(Adapter):
    """A layer called as forward(x) -> y on (B, T, C) (or a tuple whose first item is y).
    causal: True / False if known; None lets the doctor find out."""
    kind = "layer"

    def __init__(self, module, name="", causal=None, d_model=None):
        super().__init__(module, name)
        self.causal = causal
        self.d_model = d_model or _width(module)
        if self.d_model is None:
            raise TargetError(f"{self.name}: cannot tell the input width (no nn.Linear); pass d_model")

    def forward(self, x, mask=None, positions=None):
        if mask is not None:
            raise Unsupported("needs a padding mask (a plain forward(x) takes none)", "no_padding_mask")
        if positions is not None:
            raise Unsupported("needs positions (a layer takes none)", "no_positions")
        return _first_output(self.module(x))


def _width(module) -> int | None:
    if isinstance(module, nn.MultiheadAttention):
        return module.embed_dim
    for m in module.modules():
        if isinstance(m, nn.Linear):
            return m.in_features
    return None


class TorchMHA(Layer):
    """nn.MultiheadAttention as self-attention: forward(x, x, x); the padding mask goes in as its
    key_padding_mask (True = ignore), causal as attn_mask; its two paths are need_weights."""

    def __init__(self, module: nn.MultiheadAttention, name="", causal=False):
        super().__init__(module, name or "torch.nn.MultiheadAttention", causal=causal, d_model=module.embed_dim)
        self.need_weights = True   # the module's default

    @property
    def implementation(self):
        return f"need_weights={self.need_weights}"

    def forward(self, x, mask=None, positions=None):
        if positions is not None:
            raise Unsupported("needs positions (a layer takes none)", "no_positions")
        if not self.module.batch_first:
            x = x.transpose(0, 1)
        T = x.shape[0] if not self.module.batch_first else x.shape[1]
        kw = {"need_weights": self.need_weights}
        if mask is not None:
            kw["key_padding_mask"] = ~mask
        if self.causal:
            kw["attn_mask"] = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)  # True = masked
            kw["is_causal"] = True
        y, _ = self.module(x, x, x, **kw)
        return y if self.module.batch_first else y.transpose(0, 1)

    def paths(self):
        return ["need_weights=True", "need_weights=False"]

    @contextmanager
    def use_path(self, name):
        old, self.need_weights = self.need_weights, name.endswith("True")
        try:
            yield
        finally:
            self.need_weights = old
