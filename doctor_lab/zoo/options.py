"""The option space of an architecture, found by measurement: the config fields that change what
its attention code does. Each candidate value of a field of the config class or of one of its
sub-configs (a composite config's text_config: `text_config.field`) (a boolean flipped,
each value of an enum, a small integer: a window shorter than T, a layer bound below the shrunk
depth; a float halved or a softcap where none is set; each rope type; each per-layer kind) is built
one at a time over the shrunk default (shrink.make_config(options=...)) and run (a prefill of T
tokens and a cached step of two) under each attention implementation; it is an option where it
changes

  lines   the lines executed by the attention code: every transformers line run while an attention
          module, or a module inside it, is the innermost module running, and the lines of the
          attention classes' own methods while the model is built; or
  outputs the output of an attention module whose input it left equal; or
  params  the parameters and buffers the attention modules hold (name and shape, on the built
          model): an attention bias its init leaves at zero moves no output and runs no other line.

The attention modules are found by measurement, not by name: the innermost module running when a
softmax over the T keys, or scaled_dot_product_attention, is called. Then the pairs: over each
option found by its lines (a switch: a code path taken), each candidate not found alone is tried
again; where it now changes lines or outputs, the pair is an option set of its own
(use_sliding_window with max_window_layers below the depth). One option set is one row key of the
option zoo (label())."""
import json
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

T = 40          # the discovery's prompt: longer than the shrunk window (shrink.yaml: 16)
STEP = 2        # tokens of the cached step after it
SMALL_INTS = (0, 1, 4)   # a layer bound below the shrunk depth (2); a window shorter than T
MAX_STR = 8     # enum values tried per field
# what a config holds that is no option of the model (a run's metadata, its own bookkeeping)
NOT_FIELDS = {"model_type", "transformers_version", "architectures", "_name_or_path", "dtype", "torch_dtype"}


@dataclass(frozen=True)
class Candidate:
    field: str
    value: object
    kind: str           # bool | int | float | str | rope | layers

    @property
    def label(self) -> str:
        return value_label(self.field, self.value)


@dataclass
class Found:
    """One option set tried: its values, whether it is an option and by what."""
    options: dict
    label: str
    kind: str
    by: list = field(default_factory=list)       # "lines", "outputs" and/or "params"
    impls: list = field(default_factory=list)    # where it changed something
    lines: int = 0                               # attention lines it adds or removes (the most over impls)
    error: str = ""                              # why it could not be built or run (then not an option)
    over: str = ""                               # a pair: the option found alone that it was tried over

    @property
    def found(self) -> bool:
        return bool(self.by)


def value_label(name: str, value) -> str:
    """`use_sliding_window=true`, `rope_scaling=linear` (a rope dict by its type), `layer_types=[a,b]`."""
    if isinstance(value, dict) and value and all(_is_rope(x) for x in value.values()):   # a rope per layer kind
        v = ",".join(f"{k}:{value_label('', x)[1:]}" for k, x in sorted(value.items()))
    elif isinstance(value, dict):
        v = value.get("rope_type") or value.get("type") or json.dumps(value, sort_keys=True, separators=(",", ":"))
    elif isinstance(value, (list, tuple)):
        v = "[" + ",".join(str(x) for x in value) + "]"
    else:
        v = json.dumps(value)
        v = v.strip('"') if isinstance(value, str) else v
    return f"{name}={v}"


def label(options: dict) -> str:
    """An option set's row key part: its values sorted by field, joined by '+' ('' for the default)."""
    return "+".join(value_label(k, options[k]) for k in sorted(options))


# -- candidates --------------------------------------------------------------------------------------
def _doc(cls, name: str) -> tuple[str, str]:
    """(type, text) of a field in the config class's docstring ('' where it says nothing)."""
    doc = "".join(c.__doc__ or "" for c in cls.__mro__[:-1])
    m = re.search(rf"(?m)^(\s*){re.escape(name)} \(`([^`]*)`[^\n]*\n((?:\1\s+[^\n]*\n?)*)", doc)
    return (m.group(2), m.group(3)) if m else ("", "")


def _annotation(cls, name: str) -> str:
    for c in cls.__mro__:
        a = c.__dict__.get("__annotations__", {})
        if name in a:
            return str(a[name])
    return ""


def _strings(*texts) -> list[str]:
    """The string values a field's annotation (Literal[...]) or docstring names ("a", `"b"`)."""
    out = []
    for t in texts:
        for m in re.finditer(r"Literal\[([^\]]*)\]", t):
            out += re.findall(r"['\"]([\w.-]+)['\"]", m.group(1))
        out += re.findall(r"`?\"([\w.-]+)\"`?", t) if "Literal" not in t else []
    return list(dict.fromkeys(out))


def _is_rope(v) -> bool:
    return isinstance(v, dict) and ("rope_type" in v or "rope_theta" in v or "type" in v)


def _rope_types() -> list[str]:
    try:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except ImportError:
        return []
    return [t for t in ROPE_INIT_FUNCTIONS if t != "default"]


def _rope_value(base: dict | None, rope_type: str, head_dim: int, max_pos: int) -> dict:
    """A rope dict of `rope_type` with the parameters each type reads (validators ignore the others)."""
    half = max(1, head_dim // 2)
    return {**(base or {}), "rope_type": rope_type, "factor": 2.0, "original_max_position_embeddings": max_pos // 2,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "short_factor": [1.0] * half, "long_factor": [2.0] * half}


def _layer_kinds(value: list) -> list[str]:
    try:
        from transformers.configuration_utils import ALLOWED_LAYER_TYPES
    except ImportError:
        ALLOWED_LAYER_TYPES = ()
    return list(dict.fromkeys([*value, *ALLOWED_LAYER_TYPES]))


def fixed_by_shrink(cfg, generic: dict) -> set[str]:
    """The fields the shrink sets (sizes; under their own names or their attribute_map's): not options."""
    amap = getattr(cfg, "attribute_map", {}) or {}
    return set(generic) | {amap[k] for k in generic if k in amap}


def _head_dim(cfg) -> int:
    """The width of a head, for a rope's per-frequency factors (a sub-config without heads: 16)."""
    h, n = getattr(cfg, "hidden_size", None), getattr(cfg, "num_attention_heads", None)
    return getattr(cfg, "head_dim", None) or (h // n if isinstance(h, int) and isinstance(n, int) and n else 16)


def candidates(cfg, generic: dict, prefix: str = "") -> list[Candidate]:
    """Every candidate value of the config class's own fields (not the base class's, not the sizes
    the shrink sets), over the shrunk config `cfg`; and of each sub-config's (a composite config's
    text_config, attn_config), named `sub.field` (shrink.make_config sets it in that sub-config)."""
    from transformers import PretrainedConfig

    from doctor_lab.zoo.shrink import SWITCHED_BY_VALUE
    cls, d = type(cfg), cfg.to_dict()
    base = set(PretrainedConfig().to_dict()) | NOT_FIELDS
    fixed = fixed_by_shrink(cfg, generic)
    n_layers = d.get("num_hidden_layers") or getattr(cfg, "num_hidden_layers", 2)
    head_dim = _head_dim(cfg)
    subs = getattr(cls, "sub_configs", {}) or {}
    out = []
    for sub in subs:
        s = getattr(cfg, sub, None)
        if isinstance(s, PretrainedConfig):
            out += candidates(s, generic, f"{prefix}{sub}.")
    for name, v in d.items():
        if name in base or name.startswith("_") or name in subs:
            continue
        mine = []
        if name in fixed:
            if name in SWITCHED_BY_VALUE and v in (None, False):   # a window the default leaves unset: set one
                out.append(Candidate(prefix + name, generic[name], "int"))
            continue
        typ, text = _doc(cls, name)
        ann = _annotation(cls, name)
        kinds = f"{typ} {ann}".lower()
        if isinstance(v, bool) or (v is None and "bool" in kinds):
            mine.append((not v, "bool"))
        elif isinstance(v, int) or (v is None and "int" in kinds and "float" not in kinds):
            mine += [(x, "int") for x in SMALL_INTS if x != v]
        elif isinstance(v, float) or (v is None and "float" in kinds):
            mine += [(x, "float") for x in ([v / 2] if v else [0.5] if v == 0 else [0.5, 30.0])]
        elif isinstance(v, str) or (v is None and "str" in kinds):
            mine += [(s, "str") for s in _strings(ann, typ + " " + text) if s != v][:MAX_STR]
        elif _is_rope(v) or (
                v is None and "dict" in kinds and "rope" in (name + text).lower()):
            got = (v or {}).get("rope_type") or (v or {}).get("type")
            mine += [(_rope_value(v, t, head_dim, d.get("max_position_embeddings") or 8192), "rope")
                     for t in _rope_types() if t != got]
        elif isinstance(v, dict) and v and all(_is_rope(x) for x in v.values()):
            # a rope per layer kind (Gemma 3's sliding and full layers): each kind's set to each type, one at a time
            mine += [({**v, k: _rope_value(x, t, head_dim, d.get("max_position_embeddings") or 8192)}, "rope")
                     for k, x in v.items() for t in _rope_types() if t != (x.get("rope_type") or x.get("type"))]
        elif isinstance(v, list) and len(v) == n_layers and v and all(isinstance(x, str) for x in v):
            mine += [([k] * n_layers, "layers") for k in _layer_kinds(v) if [k] * n_layers != v]
        out += [Candidate(prefix + name, x, kind) for x, kind in mine]
    return out


# -- measurement -------------------------------------------------------------------------------------
@dataclass
class Trace:
    """What one build and run of the attention code did."""
    lines: frozenset         # (file, line) of the attention code, at build and at run
    io: dict                 # attention module name -> [(input, output)] per call
    attention: list          # the attention modules' names
    error: str = ""
    params: frozenset = frozenset()   # (module, name, shape) of the attention modules' parameters and buffers


def _first_tensor(args, kwargs):
    import torch
    for x in (kwargs.get("hidden_states"), *args, *kwargs.values()):
        if isinstance(x, torch.Tensor):
            return x
    return None


def _output_tensor(out):
    import torch
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None


class _Recorder:
    """The module stack (forward hooks on every module), the lines run under each module, the lines
    of each class's own methods at build, and which modules call attention (a function mode)."""

    def __init__(self, root: str):
        self.root, self.stack, self.by_module, self.by_class = root, [], {}, {}
        self.attention, self.io, self.building = set(), {}, False

    def tracer(self, frame, event, arg):
        if event != "call" or not frame.f_code.co_filename.startswith(self.root):
            return None
        owner = None
        if self.building:
            s = frame.f_locals.get("self")
            owner = type(s) if s is not None else None
        return lambda f, e, a: self._line(f, e, owner)

    def _line(self, frame, event, owner):
        if event == "line":
            where = (frame.f_code.co_filename[len(self.root):], frame.f_lineno)
            if self.building:
                if owner is not None:
                    self.by_class.setdefault(owner, set()).add(where)
            elif self.stack:
                self.by_module.setdefault(self.stack[-1], set()).add(where)
        return lambda f, e, a: self._line(f, e, owner)


def _mode(rec: _Recorder, t_keys: int):
    """A function mode marking the innermost running module at each attention call."""
    import torch
    from torch.overrides import TorchFunctionMode

    from attention_doctor.probes import SDPA, SOFTMAX

    class Marker(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if rec.stack and (func in SDPA or (func in SOFTMAX and isinstance(args[0], torch.Tensor)
                                               and args[0].dim() >= 3 and args[0].shape[-1] in t_keys)):
                rec.attention.add(rec.stack[-1])
            return func(*args, **kwargs)
    return Marker()


def trace(build, vocab_of, root: str) -> Trace:
    """build() -> the model (seeded); its attention lines at build and over a prefill of T tokens and
    a cached step of STEP; each attention module's (input, output) per call."""
    import torch
    rec = _Recorder(root)
    rec.building = True
    sys.settrace(rec.tracer)
    try:
        model = build()
    finally:
        sys.settrace(None)
        rec.building = False
    names = {m: n for n, m in model.named_modules()}
    hooks = []
    for m, n in names.items():
        hooks.append(m.register_forward_pre_hook(lambda mod, a, kw, n=n: _push(rec, n, a, kw), with_kwargs=True))
        hooks.append(m.register_forward_hook(lambda mod, a, out, n=n: _pop(rec, n, out)))
    ids = torch.randint(0, vocab_of(model), (2, T + STEP), generator=torch.Generator().manual_seed(0))
    sys.settrace(rec.tracer)
    try:
        with torch.no_grad(), _mode(rec, {T, T + STEP}):
            pre = model(input_ids=ids[:, :T], use_cache=True)
            cache = getattr(pre, "past_key_values", None)
            if cache is not None:
                model(input_ids=ids[:, T:], past_key_values=cache, use_cache=True)
    finally:
        sys.settrace(None)
        for h in hooks:
            h.remove()
    att = sorted(rec.attention)
    inside = [n for n in rec.by_module if any(n == a or n.startswith(a + ".") for a in att)]
    lines = set().union(*(rec.by_module[n] for n in inside)) if inside else set()
    classes = {type(m) for m, n in names.items() if n in rec.attention}
    lines |= set().union(*(rec.by_class.get(c, set()) for c in classes)) if classes else set()
    return Trace(frozenset(lines), {n: rec.io.get(n, []) for n in att}, att, params=structure(model, att))


def structure(model, attention: list[str]) -> frozenset:
    """What the attention modules hold: (module, name, shape) of every parameter and buffer in them.
    A flip that adds a parameter its init leaves at zero (an attention bias) moves no output and may
    run no other transformers line (the bias goes to F.linear), but the module it builds differs."""
    out = set()
    for n in attention:
        m = model.get_submodule(n)
        out |= {(n, k, tuple(t.shape)) for k, t in [*m.named_parameters(), *m.named_buffers()]}
    return frozenset(out)


def _push(rec, n, args, kwargs):
    rec.stack.append(n)
    rec.io.setdefault(n, []).append([_first_tensor(args, kwargs), None])


def _pop(rec, n, out):
    rec.stack.pop()
    rec.io[n][-1][1] = _output_tensor(out)


def outputs_moved(a: Trace, b: Trace) -> bool:
    """An attention module's output differs where its input did not (same name, same call, and every
    earlier call's input equal too: a cached step reads what the prefill left)."""
    import torch
    for n, calls in a.io.items():
        for (xa, ya), (xb, yb) in zip(calls, b.io.get(n, [])):
            if xa is None or xb is None or ya is None or yb is None or xa.shape != xb.shape or not torch.equal(xa, xb):
                break
            if ya.shape != yb.shape or not torch.equal(ya, yb):
                return True
    return False


def _line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:200]


def measure(arch: str, impl: str, table: dict, options: dict, root: str) -> Trace:
    """The trace of `arch` built with `options` under `impl` (Trace.error: why it could not)."""
    from doctor_lab.zoo.worker import NotBuilt, _is_memory, _vocab, build

    def built():
        try:
            _, model, cfg = build(arch, impl, table, options=options)
        except NotBuilt as e:
            raise RuntimeError(e.result.get("reason") or e.result.get("status")) from None
        built.cfg = cfg
        return model
    try:
        return trace(built, lambda m: _vocab(m, built.cfg), root)
    except Exception as e:  # noqa: BLE001 -- the option does not build or run here: an error, never an option
        if _is_memory(e):
            raise
        return Trace(frozenset(), {}, [], _line(e))


def compare(base: dict[str, Trace], tried: dict[str, Trace], f: Found) -> Found:
    """f filled in: by what (lines, outputs) and under which impls the traces differ from base's."""
    errors = []
    for impl, t in tried.items():
        b = base.get(impl)
        if b is None or b.error:
            continue
        if t.error:
            errors.append(f"{impl}: {t.error}")
            continue
        changed = len(b.lines ^ t.lines)
        moved = outputs_moved(b, t)
        built = b.params != t.params
        if changed or moved or built:
            f.impls.append(impl)
            f.lines = max(f.lines, changed)
            f.by = sorted(set(f.by) | ({"lines"} if changed else set()) | ({"outputs"} if moved else set())
                          | ({"params"} if built else set()))
    if not f.impls and errors:
        f.error = "; ".join(errors)[:300]
    return f


def discover(arch: str, impls, table: dict, pairs: bool = True, root: str | None = None) -> dict:
    """The option table of one architecture: every candidate tried alone, then over each switch
    found by its lines; the cost of finding it (wall and CPU seconds). root: the directory whose
    files hold the attention code (default: the imported transformers package)."""
    import resource

    import transformers

    from doctor_lab.zoo.shrink import SWITCHED_BY_VALUE, make_config
    t0 = time.perf_counter()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    root = root or str(Path(transformers.__file__).parent) + "/"
    cfg = make_config(arch, table)
    base = {i: measure(arch, i, table, {}, root) for i in impls}
    out = {"arch": arch, "transformers": transformers.__version__, "impls": list(impls),
           "attention": sorted({n.split(".")[-1] for t in base.values() for n in t.attention}),
           "base_errors": {i: t.error for i, t in base.items() if t.error}, "tried": []}
    if all(t.error for t in base.values()):
        out["status"] = "not_built"
    else:
        # where the model takes a sub-config of the composite one (the shrink table's `use`), its fields are that sub-config's
        use = (table["archs"].get(arch) or {}).get("use")
        cands = candidates(cfg, table["generic"], f"{use}." if use else "")
        alone = [compare(base, {i: measure(arch, i, table, {c.field: c.value}, root) for i in impls},
                         Found({c.field: c.value}, c.label, c.kind)) for c in cands]
        tried = list(alone)
        # a candidate that needs a value the shrunk default leaves unset (a per-layer sliding kind needs a
        # window, and a window its switch): what failed alone is tried again over each switch flipped and
        # each value the shrink switches on by setting it
        switched = [c for c in cands if c.field in SWITCHED_BY_VALUE or c.kind == "bool"]
        for f in [f for f in alone if f.error and not f.found]:
            for c in switched:
                opts = {c.field: c.value, **f.options}
                if len(opts) > len(f.options):
                    tried.append(compare(base, {i: measure(arch, i, table, opts, root) for i in impls},
                                         Found(opts, label(opts), f"{f.kind}+{c.kind}", over=value_label(c.field, c.value))))
        if pairs:
            for f in [f for f in alone if "lines" in f.by and f.kind in ("bool", "str", "layers")]:
                over = {i: measure(arch, i, table, f.options, root) for i in impls}
                for c in cands:
                    if c.field in f.options or any(g.found and g.options == {c.field: c.value} for g in alone):
                        continue
                    opts = {**f.options, c.field: c.value}
                    tried.append(compare(over, {i: measure(arch, i, table, opts, root) for i in impls},
                                         Found(opts, label(opts), f"{f.kind}+{c.kind}", over=f.label)))
        out["status"] = "discovered"
        out["tried"] = [asdict(f) | {"found": f.found} for f in tried]
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    out["cost"] = {"wall_s": round(time.perf_counter() - t0, 1),
                   "cpu_s": round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 1)}
    return out


def option_sets(discovered: dict) -> list[dict]:
    """The option sets the option zoo examines for one architecture: the default ({}) and each found."""
    return [{}] + [t["options"] for t in discovered.get("tried", []) if t["found"]]
