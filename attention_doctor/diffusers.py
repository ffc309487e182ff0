"""diffusers' attention: its `Attention` module (and the attention modules of its transformer
models) with any of its attention processors, as a bidirectional layer; self-attention, or the
processor's cross / joint path with the context taken from the input sequence. A builder of small
random-weight modules by processor name (`diffusers:PROCESSOR[,cross][,ARG=VALUE...]`). diffusers
is imported only when one is built.

The processors differ in what they are called with, and PROCESSORS says it once per family
(the first rule that names a key wins): which module holds them, the module's and the processor's
constructor arguments, the input layout ((B, C, H, W) for the added-KV family), the batch layout
of perturbed-attention guidance (the batch repeated, the first copy's output kept), whether the
cross path joins a second stream to the keys, and the mask's form. The mask is what diffusers'
own models pass: `(1 - keep) * -10000.0` as (B, 1, S) for `Attention`'s processors (UNet2DCondition,
Transformer2D, PixArt, Sana), a keep-mask for Lumina's and Mochi's, a (B, 1, 1, S) bool keep-mask
for the attention dispatcher of the newer modules (Flux).
"""
import difflib
import inspect
import re
from contextlib import contextmanager

import torch

from attention_doctor.adapters import Adapter, TargetError, Unreachable, Unsupported, target_scope
from attention_doctor.signals import TargetRaised, said
from attention_doctor.xtransformers import parse

WIDTH, HEADS, DIM_HEAD, IP_TOKENS = 32, 4, 8, 4
MASK_FILL = -10000.0   # diffusers' models: (1 - mask) * -10000.0

# processor name (regex, searched) -> how to drive it; every matching rule applies, in order (a
# later rule adds the keys an earlier one did not set), and a rule with `cannot` ends the search
PROCESSORS = [
    (r"^LoRA", {"cannot": "a deprecated placeholder without __call__ (LoRA layers come from PEFT since "
                          "diffusers 0.26)"}),
    (r"XFormers", {"cannot": "needs xformers, whose kernels are CUDA-only; its wheels pin a CUDA torch "
                             "(installing it would replace this torch 2.13 CPU build)"}),
    (r"NPU", {"cannot": "needs torch_npu and an Ascend NPU"}),
    (r"^XLA", {"cannot": "needs torch_xla (TPU); on this machine its constructor raises InvalidVersion"}),
    (r"^FluxIPAdapter", {"cannot": "FluxIPAdapterAttnProcessor needs image-prompt embeddings projected by a "
                                   "Flux IP-Adapter (not part of the attention module)"}),
    (r"^SD3IPAdapter", {"cannot": "needs timestep embeddings and image-prompt tokens from an SD3 IP-Adapter "
                                  "pipeline (ip_hidden_states, temb), not part of the attention module"}),
    (r"^(Fused)?Flux", {"module": "FluxAttention", "joint": True, "mask": "bool4",
                        "cross_attn": {"added_kv_proj_dim": WIDTH, "context_pre_only": False}}),
    (r"^MochiAttn", {"module": "MochiAttention", "attn": {"added_kv_proj_dim": WIDTH}, "joint": True,
                     "mask": "keep", "mask_required": True,
                     "mask_scope": "its text stream only (a per-row list of valid text tokens)",
                     "modes": {"self": "joint video-text attention: needs the text stream"}}),
    (r"^SanaMultiscale", {"module": "SanaMultiscaleLinearAttention", "image": True,
                          "mask_scope": "none (its forward takes no mask)",
                          "modes": {"cross": "a multiscale linear self-attention (no context argument)"}}),
    (r"AddedKV", {"attn": {"added_kv_proj_dim": WIDTH, "norm_num_groups": HEADS}, "image": True,
                  "mask_scope": "its context tokens only (the image's own keys are appended unmasked)"}),
    (r"^PAG.*Joint", {"modes": {"self": "SD3's perturbed-attention guidance: joint attention, needs the text stream"}}),
    # q/k norms as diffusers' own models build these modules (SD3.5, CogVideoX, HunyuanDiT, AuraFlow)
    (r"Joint", {"attn": {"qk_norm": "rms_norm"}}),
    (r"CogVideoX|Hunyuan", {"attn": {"qk_norm": "layer_norm"}}),
    (r"AuraFlow", {"attn": {"qk_norm": "fp32_layer_norm"}}),
    (r"Joint|AuraFlow", {"joint": True, "cross_attn": {"added_kv_proj_dim": WIDTH, "context_pre_only": False}}),
    (r"CogVideoX", {"joint": True, "modes": {"self": "joint text-video attention: needs the text stream"}}),
    (r"Lumina", {"attn": {"qk_norm": "layer_norm_across_heads", "kv_heads": HEADS}, "mask": "keep",
                 "mask_required": True,
                 "modes": {"self": "LuminaNextDiT's cross-attention: needs encoder_hidden_states and a mask"}}),
    (r"^IPAdapter", {"init": {"hidden_size": HEADS * DIM_HEAD, "cross_attention_dim": WIDTH,
                              "num_tokens": (IP_TOKENS,)},
                     "ip_tokens": IP_TOKENS, "modes": {"self": "image-prompt cross-attention: needs the text context"}}),
    (r"^CustomDiffusion", {"init": {"hidden_size": HEADS * DIM_HEAD, "cross_attention_dim": WIDTH}}),
    (r"^Sliced", {"init": {"slice_size": 1}}),
    (r"^PAG(?!.*Joint)", {"modes": {"cross": "perturbed-attention guidance replaces self-attention layers only "
                                  "(diffusers' pag_applied_layers)"}}),
    (r"^PAGCFG", {"copies": 3}),
    (r"^PAG", {"copies": 2}),
    (r"^Fused", {"fuse": True}),
]


def recipe(name: str) -> dict:
    """How the processor class `name` is driven (PROCESSORS' rules merged)."""
    out: dict = {}
    for pattern, rule in PROCESSORS:
        if re.search(pattern, name):
            for k, v in rule.items():
                if isinstance(v, dict) and isinstance(out.get(k), dict):
                    out[k] = {**v, **out[k]}
                else:
                    out.setdefault(k, v)
            if "cannot" in out:
                break
    return out


def processor_names() -> list[str]:
    """Every attention processor class of diffusers.models.attention_processor (its
    IPAdapterMaskProcessor is an image mask preprocessor imported there, not one of them)."""
    from diffusers.models import attention_processor as ap
    return [n for n, c in vars(ap).items()
            if inspect.isclass(c) and c.__module__ == ap.__name__ and "Processor" in n]


def _module_class(name: str):
    from diffusers.models import attention_processor as ap
    if name == "FluxAttention":
        from diffusers.models.transformers.transformer_flux import FluxAttention
        return FluxAttention
    return getattr(ap, name)


def target(spec: str) -> "DiffusersAttention":
    """`diffusers:SPEC` on the command line."""
    return build(spec)


def build(spec: str, seed: int = 0) -> "DiffusersAttention":
    """`PROCESSOR[,cross][,ARG=VALUE...]` -> a small module holding that processor, in an
    adapter. ARG=VALUE go to the module's constructor (qk_norm='rms_norm', upcast_softmax=True,
    kv_heads=2, ...). Raises TargetError for a processor that cannot run here (saying why)."""
    from diffusers.models import attention_processor as ap
    from diffusers.utils import logging
    logging.set_verbosity_error()
    name, _, rest = spec.partition(",")
    cross = False
    if rest.split(",")[0].strip() in ("cross", "self"):
        cross = rest.split(",")[0].strip() == "cross"
        rest = rest.partition(",")[2]
    extra = parse(rest) if rest.strip() else {}
    if not isinstance(getattr(ap, name, None), type):
        close = difflib.get_close_matches(name, processor_names(), n=4, cutoff=0.6)
        raise TargetError(f"diffusers:{name}: not a processor of diffusers.models.attention_processor"
                          + (f" (did you mean {', '.join(close)}?)" if close else ""))
    r = recipe(name)
    mode = "cross" if cross else "self"
    if "cannot" in r:
        raise TargetError(f"diffusers:{name}: cannot run here: {r['cannot']}")
    if mode in r.get("modes", {}):
        raise TargetError(f"diffusers:{name}: no {mode}-attention: {r['modes'][mode]}")
    torch.manual_seed(seed)
    try:
        processor = getattr(ap, name)(**r.get("init", {}))
        module = _module(r, cross, processor, extra)
        if r.get("fuse"):
            module.fuse_projections()
    except (TypeError, ValueError, ImportError, AttributeError) as e:
        raise TargetError(f"diffusers:{spec}: cannot build it ({type(e).__name__}: {' '.join(str(e).split())[:160]})") from None
    return DiffusersAttention(module.eval(), f"diffusers:{name}" + (",cross" if cross else ""), cross=cross,
                              recipe=r)


def _module(r: dict, cross: bool, processor, extra: dict):
    """The module that holds the processor, small: WIDTH channels, HEADS heads of DIM_HEAD."""
    cls = _module_class(r.get("module", "Attention"))
    if cls.__name__ == "SanaMultiscaleLinearAttention":   # sets its own processor
        return cls(in_channels=WIDTH, out_channels=WIDTH, num_attention_heads=HEADS, attention_head_dim=DIM_HEAD, **extra)
    kw = {"query_dim": WIDTH, "heads": HEADS, "dim_head": DIM_HEAD, **r.get("attn", {})}
    if cross:
        kw.update(r.get("cross_attn", {}) if r.get("joint") else {"cross_attention_dim": WIDTH})
    return cls(**kw, **extra, processor=processor)


class DiffusersAttention(Adapter):
    """A diffusers attention module with its processor, as a bidirectional layer on (B, T, C).
    cross: the processor's cross (or joint) path, with the context taken from the input
    sequence; recipe: how the processor is called (PROCESSORS), {} for the plain
    Attention(hidden_states, encoder_hidden_states, attention_mask) call."""
    kind = "layer"

    def __init__(self, module, name="", cross=False, recipe=None):
        super().__init__(module, name or f"diffusers {type(module).__name__}")
        self.cross = cross
        self.recipe = dict(recipe or {})
        self.causal = bool(getattr(module, "is_causal", False))
        self.d_model = getattr(module, "query_dim", None) or WIDTH
        self._paths = None
        self._refused = {}   # a path that raised on a small input: its error

    def forward(self, x, mask=None, positions=None):
        if positions is not None:
            raise Unsupported("needs positions (an attention processor takes rotary embeddings, not positions)",
                              "no_positions")
        r, B = self.recipe, x.shape[0]
        kw = {}
        if self.cross:
            kw["encoder_hidden_states"] = self._context(x)
        if mask is not None:
            if r.get("mask_scope"):
                raise Unsupported(f"needs a padding mask over its input (this processor masks {r['mask_scope']})",
                                  "no_padding_mask")
            if self.cross:   # the keys hold the input twice: as the context (twice over) or as a second stream
                mask = torch.cat([mask, mask], dim=-1)
        elif r.get("mask_required"):   # its processor reads the mask unconditionally: all keys visible
            ctx = kw.get("encoder_hidden_states", x)
            mask = torch.ones(B, (ctx[0] if isinstance(ctx, tuple) else ctx).shape[1], dtype=torch.bool, device=x.device)
        if mask is not None:
            kw["attention_mask"] = self._mask_form(mask, x.dtype)
        h = x.transpose(1, 2)[..., None] if r.get("image") else x   # (B, C, T, 1): an image of T x 1
        copies = r.get("copies", 1)
        if copies > 1:   # perturbed-attention guidance: [uncond,] cond, perturbed; the first copy is plain attention
            h = h.repeat(copies, *[1] * (h.dim() - 1))
            kw = {k: _repeat(v, copies - 1 if k == "attention_mask" else copies) for k, v in kw.items()}  # the perturbed copy attends to nothing
        out = self.module(h, **kw)
        if isinstance(out, tuple):   # a joint processor also returns the context stream
            out = out[0]
        if r.get("image"):
            out = out[..., 0].transpose(1, 2)
        if out.dim() == 4:   # Lumina's processor returns heads unmerged (its block merges them)
            out = out.flatten(2)
        return out[:B]

    def _context(self, x):
        """The cross path's context: the input itself (a joint processor's second stream), or the
        input twice over for a plain cross-attention, so that the context is longer than the
        queries, as a text prompt is not the image's length, while attending to it is attending to
        the input (every key twice: the same weights, halved). Image-prompt tokens are fixed."""
        ctx = x if self.recipe.get("joint") else torch.cat([x, x], dim=1)
        n = self.recipe.get("ip_tokens")
        if n:
            g = torch.Generator().manual_seed(123)
            ip = torch.randn(1, n, x.shape[-1], generator=g).to(x.device, x.dtype).expand(x.shape[0], -1, -1)
            return (ctx, [ip])
        return ctx

    def _mask_form(self, mask, dtype):
        form = self.recipe.get("mask", "additive")
        if form == "keep":
            return mask
        if form == "bool4":
            return mask[:, None, None, :]
        return ((1 - mask.to(dtype)) * MASK_FILL)[:, None, :]

    # -- paths: the processors diffusers swaps on the same weights ---------------------------------
    def paths(self):
        """The current processor and the others diffusers treats as interchangeable with it on
        the same weights (its CROSS_ATTENTION_PROCESSORS / ADDED_KV_ATTENTION_PROCESSORS groups,
        and the Fused<Name> / <Name> pair over fuse_projections()) that take the same call here
        (PROCESSORS: the same input layout, image-prompt tokens, joint stream, batch copies and
        mask form). One that raises on a small input stays a path the doctor cannot drive
        (use_path: Unreachable), never dropped."""
        if self._paths is None:
            self._refused = {}
            names = [n for n in self._alternatives() if self._same_call(n)]
            for n in names:
                err = self._runs(n)
                if err:
                    self._refused[n] = err
            self._paths = [type(self.module.processor).__name__] + names
        return list(self._paths)

    def _same_call(self, name) -> bool:
        """The processor `name` is driven with the call this one is (PROCESSORS' keys that shape it)."""
        keys = ("image", "ip_tokens", "joint", "copies", "mask", "mask_required", "mask_scope", "module")
        mine, theirs = self.recipe, recipe(name)
        return all(mine.get(k) == theirs.get(k) for k in keys)

    def _alternatives(self) -> list[str]:
        from diffusers.models import attention_processor as ap
        cur = type(self.module.processor).__name__
        names = set()
        for group in (getattr(ap, "CROSS_ATTENTION_PROCESSORS", ()), getattr(ap, "ADDED_KV_ATTENTION_PROCESSORS", ())):
            if any(cur == c.__name__ for c in group):
                names |= {c.__name__ for c in group if not issubclass(c, torch.nn.Module)}   # no weights of their own
        twin = cur[len("Fused"):] if cur.startswith("Fused") else "Fused" + cur
        if hasattr(ap, twin):
            names.add(twin)
        return sorted(n for n in names - {cur} if "cannot" not in recipe(n))

    def _runs(self, name) -> str | None:
        """None where the processor `name` runs a forward on a small input here, else what it raised."""
        try:
            cm = self.use_path(name)
            cm.__enter__()
        except Exception as e:  # noqa: BLE001 -- diffusers refuses to build or set this processor here: the path stays, unreachable (inconclusive), never dropped
            return said(e)
        try:
            with torch.no_grad(), target_scope(self.module):   # a no-op inside the doctor's own scope
                self.forward(torch.zeros(1, 4, self.d_model, dtype=self.dtype, device=self.device))
        except TargetRaised as e:
            return e.error
        finally:
            cm.__exit__(None, None, None)
        return None

    @contextmanager
    def use_path(self, name):
        from diffusers.models import attention_processor as ap
        if name in getattr(self, "_refused", {}):
            raise Unreachable(f"path {name} raises on this module's call ({self._refused[name][:120]}): diffusers "
                              "lists it as interchangeable, the doctor cannot drive it")
        old = self.module.processor
        if name != type(old).__name__:
            if "fuse" in recipe(name) and not getattr(self.module, "fused_projections", False):
                self.module.fuse_projections()
            self.module.set_processor(getattr(ap, name)(**recipe(name).get("init", {})))
        try:
            yield
        finally:
            self.module.set_processor(old)


def _repeat(v, n):
    if isinstance(v, torch.Tensor):
        return v.repeat(n, *[1] * (v.dim() - 1))
    if isinstance(v, tuple):
        return tuple(_repeat(t, n) for t in v)
    if isinstance(v, list):
        return [_repeat(t, n) for t in v]
    return v
