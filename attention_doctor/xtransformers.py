"""x-transformers' decoder-only LMs (`TransformerWrapper` + `Decoder`): an adapter through the
library's own call conventions, and a builder of small random-weight models from its options
(`xt:OPTION=VALUE,...`). x-transformers is imported only when one is built.

Its conventions: the padding mask is `mask=` (bool, True = keep, as the doctor's); positions are
`pos=` (or `seq_start_pos=` for left padding, which shifts absolute positions per row); the KV
cache is the `LayerIntermediates` that `return_intermediates=True` returns, passed back as
`cache=` with the whole sequence so far and `cache_age=` new tokens; its two attention paths are
`Attend.flash` (scaled_dot_product_attention) and the einsum path with its own masking and softmax.
"""
import ast
import inspect
from contextlib import contextmanager

import torch

from attention_doctor.adapters import Adapter, TargetError, Unsupported
from attention_doctor.signals import doctor_hook

# A small model: the doctor's inputs are 16 tokens; positions reach +4096 (long_positions)
SMALL = dict(num_tokens=64, max_seq_len=8192)
DECODER = dict(dim=32, depth=2, heads=4, attn_dim_head=8)
PATHS = ("flash=True", "flash=False")


def parse(spec: str) -> dict:
    """'rotary_pos_emb=True,attn_kv_heads=2' -> {'rotary_pos_emb': True, 'attn_kv_heads': 2}.
    A value is a Python literal (True, 2, 0.5, (1, 2), 'x'); a bare word is a string."""
    out = {}
    for part in _split(spec):
        key, eq, val = part.partition("=")
        key = key.strip()
        if not eq or not key.isidentifier():
            raise TargetError(f"xt:{spec}: '{part}' is not OPTION=VALUE (e.g. xt:rotary_pos_emb=True,attn_flash=True)")
        try:
            out[key] = ast.literal_eval(val.strip())
        except (ValueError, SyntaxError):
            out[key] = val.strip()
    return out


def _split(spec: str) -> list[str]:
    """Commas outside brackets separate options (a tuple value keeps its commas)."""
    parts, depth, cur = [], 0, ""
    for ch in spec:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [p for p in (*parts, cur) if p.strip()]


def _accepts(cls) -> set[str]:
    return set(inspect.signature(cls.__init__).parameters)


def build(options: dict | str = "", seed: int = 0) -> "XTransformersLM":
    """A TransformerWrapper over a Decoder with random weights, in its adapter: SMALL and DECODER,
    then `options` (each goes to TransformerWrapper if it names one of its arguments, else to the
    Decoder, as x-transformers' own prefixes say: attn_*, ff_*, rotary_pos_emb, ...). Raises
    TargetError when x-transformers refuses the options.

    Without attn_flash=True the model runs the einsum path, but it is built flash-capable where
    x-transformers allows flash with these options (Attend holds no weights: the same seed gives
    the same model), so the doctor can compare the two paths."""
    opts = parse(options) if isinstance(options, str) else dict(options)
    name = f"xt:{_spec(opts)}"
    if opts.get("attn_flash"):
        return XTransformersLM(_build(opts, seed), name, flash_capable=True)
    try:
        model = _build({**opts, "attn_flash": True}, seed)
    except TargetError:
        return XTransformersLM(_build(opts, seed), name, flash_capable=False)
    for a in _attends(model):
        a.flash = False
    return XTransformersLM(model, name, flash_capable=True)


def _build(opts: dict, seed: int):
    from x_transformers import Decoder, TransformerWrapper
    wrapper_args = _accepts(TransformerWrapper) - {"self", "attn_layers"}
    wrapper = {**SMALL, **{k: v for k, v in opts.items() if k in wrapper_args}}
    decoder = {**DECODER, **{k: v for k, v in opts.items() if k not in wrapper_args}}
    if "verbose" in _accepts(Decoder.__mro__[1]) and "verbose" not in decoder:
        decoder["verbose"] = False   # 2.x warns that a small rotary dim is small
    torch.manual_seed(seed)
    try:
        model = TransformerWrapper(**wrapper, attn_layers=Decoder(**decoder))
    except (AssertionError, TypeError, ValueError, ImportError) as e:
        said = " ".join(str(e).split())[:200] or type(e).__name__
        raise TargetError(f"xt:{_spec(opts)}: x-transformers refuses these options ({said})") from None
    return model.eval()


def target(spec: str) -> "XTransformersLM":
    """`xt:SPEC` on the command line."""
    adapter = build(spec)
    adapter.name = f"xt:{spec}"
    return adapter


def _spec(opts: dict) -> str:
    return ",".join(f"{k}={v!r}" for k, v in opts.items())


def _attends(model) -> list:
    return [m for m in model.modules() if type(m).__name__ == "Attend" and hasattr(m, "flash")]


class XTransformersLM(Adapter):
    """x-transformers' TransformerWrapper over a Decoder: logits from forward(ids, mask=, pos=);
    prefill / step through `cache=` + `return_intermediates=True`; the paths flash=True and
    flash=False where the model is flash-capable: the einsum path takes every option, the flash
    path only those x-transformers allows with flash (its constructor asserts which), so a model
    is flash-capable when it was built with flash on (flash_capable=None: every Attend has flash
    on now; a model built with flash off has no flash path to compare with)."""
    kind = "lm"

    def __init__(self, model, name="", flash_capable: bool | None = None):
        super().__init__(model, name or "x-transformers TransformerWrapper")
        attends = _attends(model)
        self.flash_capable = bool(attends) and (all(a.flash for a in attends) if flash_capable is None else flash_capable)
        self.vocab_size = getattr(model, "num_tokens", None)
        if self.vocab_size is None:
            raise TargetError(f"{self.name}: not a TransformerWrapper (no num_tokens)")
        absolute = type(getattr(model, "pos_emb", None)).__name__ == "AbsolutePositionalEmbedding"
        self.max_len = model.max_seq_len if absolute else None

    def forward(self, x, mask=None, positions=None):
        kw = {}
        if mask is not None:
            kw["mask"] = mask
        if positions is not None:
            kw.update(self._positions(positions))
        rotary = getattr(self.module.attn_layers, "rotary_pos_emb", None) or getattr(self.module.attn_layers, "polar_pos_emb", None)
        if "pos" not in kw or not isinstance(rotary, torch.nn.Module):
            return self.module(x, **kw)
        seen = []
        hook = rotary.register_forward_hook(doctor_hook(lambda m, args, out: seen.append(args[0])))
        try:
            out = self.module(x, **kw)
        finally:
            hook.remove()
        T = x.shape[1]
        if not any(t.numel() >= T and torch.equal(t.reshape(-1)[-T:].long(), kw["pos"].reshape(-1)[-T:]) for t in seen):
            raise Unsupported(f"needs positions (this release's TransformerWrapper does not pass pos= on to its "
                              f"{type(rotary).__name__}: it counts from 0)", "no_positions")
        return out

    def _positions(self, pos) -> dict:
        """Rows with the same positions: `pos` (T,), which every position scheme takes; rows that
        start late (a left-padded batch's positions from the mask): `seq_start_pos`, the library's
        own way to say it; anything else: `pos` (B, T)."""
        T = pos.shape[1]
        start = (T - 1 - pos[:, -1])
        ar = torch.arange(T, device=pos.device)
        if not bool((pos == pos[:1]).all()) and bool((pos == (ar - start[:, None]).clamp(min=0)).all()):
            return {"seq_start_pos": start}
        rel = getattr(getattr(self.module, "attn_layers", None), "rel_pos", None)
        if rel is not None and type(rel).__name__ != "AlibiPositionalBias":   # x-transformers asserts so
            raise Unsupported(f"needs positions ({type(rel).__name__} takes no pos=; only left padding's "
                              "seq_start_pos=)", "no_positions")
        return {"pos": pos[0] if bool((pos == pos[:1]).all()) else pos}

    def prefill(self, x):
        if not getattr(self.module, "can_cache_kv", False):
            raise Unsupported("needs a KV cache (this TransformerWrapper says can_cache_kv=False: memory "
                              "tokens, recycling or an attention option that cannot be cached)", "no_kv_cache")
        logits, cache = self.module(x, cache=None, return_intermediates=True)
        return (x, cache), logits

    def step(self, state, x):
        seen, cache = state
        ids = torch.cat([seen, x], dim=1)
        logits, cache = self.module(ids, cache=cache, return_intermediates=True, cache_age=x.shape[1])
        return (ids, cache), logits

    def embedding(self):
        return getattr(self.module, "token_emb", None)

    def paths(self):
        return list(PATHS) if self.flash_capable else []

    @contextmanager
    def use_path(self, name):
        if name not in self.paths():
            raise Unsupported(f"no path {name} (paths: {', '.join(self.paths()) or 'none: built with flash=False'})",
                              "no_paths")
        attends = _attends(self.module)
        old = [a.flash for a in attends]
        for a in attends:
            a.flash = name == "flash=True"
        try:
            yield
        finally:
            for a, f in zip(attends, old):
                a.flash = f
