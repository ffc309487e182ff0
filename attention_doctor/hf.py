"""transformers' causal LMs: an adapter through the public API of transformers 5.x, and a builder
of small random-weight models from a config (no download). transformers is imported only here,
and only when a transformers model is examined or built."""
import copy
import difflib
import re
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from attention_doctor.adapters import CACHE_ARGS, Adapter, TargetError, Unreachable, Unsupported, _params, moved
from attention_doctor.module_state import restored
from attention_doctor.signals import NotPerformed, TargetRaised, said
from attention_doctor.windows import declared_windows

# how to get transformers, in every message that needs it (README and --help say the same)
INSTALL = "pip install -r requirements-validation.txt (in the clone: the transformers release the zoo pins)"

# A small model: these attribute names are the common ones of transformers' configs (each
# config maps its own names onto them through attribute_map, e.g. GPT-2's n_embd).
SMALL = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=8192)
PATHS = ("eager", "sdpa")
SMALL_WINDOW = 16   # a declared sliding window, shrunk: the doctor's T (16) inside it, the sliding_window check's beyond
KV_HEADS = 2


def transformers():
    """The transformers module, or a TargetError naming the install command (exit 2, one line)."""
    try:
        import transformers as tf
    except ImportError as e:
        raise TargetError(f"needs transformers, which is not installed here: {INSTALL}"
                          if isinstance(e, ModuleNotFoundError) and e.name == "transformers"
                          else f"transformers does not import ({type(e).__name__}: {str(e).splitlines()[0][:160]})") from None
    return tf


def causal_lm_types() -> list[str]:
    """The model types transformers' auto classes build as causal LMs."""
    transformers()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def unknown_type(model_type: str) -> TargetError:
    """hf:NAME that is not a causal LM type: the close names, or where to list them all."""
    types = causal_lm_types()
    close = difflib.get_close_matches(model_type.lower(), types, n=5, cutoff=0.6)
    hint = (f"did you mean {', '.join(close)}?" if close else
            f"{len(types)} types, e.g. {', '.join(types[:3])}: all of them in transformers.models.auto."
            "modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES")
    return TargetError(f"hf:{model_type}: not a causal LM model type of transformers {transformers().__version__}; {hint}")


def small_config(model_type: str, **overrides):
    """AutoConfig.for_model(model_type) shrunk to SMALL (and overrides), special token ids inside
    the small vocabulary. Raises TargetError for an unknown model type (with close names) or a
    missing transformers (with the install command)."""
    transformers()
    from transformers import AutoConfig
    try:
        cfg = AutoConfig.for_model(model_type)
    except (ValueError, KeyError):
        raise unknown_type(model_type) from None
    for k, v in {**SMALL, **overrides}.items():
        setattr(cfg, k, v)
    d = cfg.to_dict()
    if "head_dim" in d and "head_dim" not in overrides:  # derived, not the 7B default
        cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
    if "num_key_value_heads" in d and "num_key_value_heads" not in overrides:
        cfg.num_key_value_heads = KV_HEADS  # grouped-query where the architecture has it
    if isinstance(d.get("query_pre_attn_scalar"), (int, float)) and "query_pre_attn_scalar" not in overrides:
        cfg.query_pre_attn_scalar = cfg.hidden_size // cfg.num_attention_heads  # Gemma 2/3: head_dim
    if isinstance(d.get("rotary_dim"), int) and "rotary_dim" not in overrides:  # GPT-J, CodeGen: within a head
        cfg.rotary_dim = min(cfg.rotary_dim, cfg.hidden_size // cfg.num_attention_heads)
    if isinstance(d.get("layer_types"), list) and "layer_types" not in overrides:   # one per layer built
        cfg.layer_types = d["layer_types"][:cfg.num_hidden_layers]
    if isinstance(d.get("sliding_window"), int) and "sliding_window" not in overrides:
        cfg.sliding_window = SMALL_WINDOW   # within the sliding_window check's reach (the zoo's shrunk configs alike)
    if d.get("is_decoder") is False and "is_decoder" not in overrides:
        cfg.is_decoder = True   # BERT-style encoders are causal LMs only as decoders (transformers says so)
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = getattr(cfg, k, None)
        if isinstance(v, int) and v >= cfg.vocab_size:
            setattr(cfg, k, cfg.vocab_size - 1)
    return cfg


def build(model_type_or_config, attn_implementation: str | None = None, seed: int = 0, **overrides):
    """A causal LM with random weights from a small config: `build("llama", "sdpa")`."""
    transformers()
    from transformers import AutoModelForCausalLM
    cfg = (small_config(model_type_or_config, **overrides) if isinstance(model_type_or_config, str)
           else model_type_or_config)
    torch.manual_seed(seed)
    kw = {"attn_implementation": attn_implementation} if attn_implementation else {}
    mt = getattr(cfg, "model_type", "?")
    if isinstance(model_type_or_config, str) and mt not in causal_lm_types():
        raise unknown_type(model_type_or_config)
    try:
        model = AutoModelForCausalLM.from_config(cfg, **kw)
    except ValueError as e:
        raise TargetError(f"hf:{mt}: {str(e).splitlines()[0][:160]}") from None
    return model.eval()


def _takes(fn, name) -> bool:
    """fn accepts the keyword `name` (by name or through **kwargs)."""
    import inspect
    try:
        ps = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in ps)


# transformers' preallocated cache kinds (generate()'s cache_implementation): a model whose generation
# config names one decodes through it by default, with no grown cache to compare a static one against
PREALLOCATED = ("static", "hybrid", "sliding_window", "hybrid_chunked", "offloaded_static", "offloaded_hybrid")
IMAGE_TOKEN = ("image_token_index", "image_token_id")   # a config's image token: its token types mark images
# the keyword a causal LM takes its cache under, and the output field it returns it in: transformers
# 5.25 renamed some models' past_key_values to cache (Mamba, FalconMamba, Mamba2)
STATE_NAMES = ("past_key_values", "cache")


def _capacity(cache) -> int | None:
    """The fixed capacity of a preallocated cache (its own max_cache_len: 4.x's StaticCache, HybridCache,
    SlidingWindowCache), None for one that grows."""
    n = vars(cache).get("max_cache_len") if hasattr(cache, "__dict__") else None
    return n if isinstance(n, int) and not isinstance(n, bool) else None


@dataclass(frozen=True)
class FixedCache:
    """A preallocated cache the adapter built, and the tokens it holds: their positions go with each step,
    and a step of several tokens goes in one token at a time (step)."""
    cache: object
    seen: int


@dataclass(frozen=True)
class InPlaceCache:
    """A cache the forward fills in place under its argument `name` (it returns none), and the tokens it
    was fed: a step may need them (XLM reads the whole sequence and keeps what its cache lacks)."""
    cache: object
    name: str
    tokens: torch.Tensor


class HFCausalLM(Adapter):
    """Any transformers causal LM: logits from forward(input_ids, attention_mask, position_ids);
    the cache through past_key_values / use_cache; paths through set_attn_implementation."""
    kind = "lm"

    def __init__(self, model, name=""):
        super().__init__(model, name or f"transformers {type(model).__name__}")
        cfg = model.config
        if hasattr(cfg, "get_text_config"):   # a composite (multimodal) config keeps these in its text part
            cfg = cfg.get_text_config()
        emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        self.vocab_size = getattr(cfg, "vocab_size", None) or getattr(emb, "num_embeddings", None)
        if self.vocab_size is None:
            raise TargetError(f"{self.name}: no vocab_size in its config and no input embedding")
        pad = getattr(cfg, "pad_token_id", None)
        self.pad_id = pad if isinstance(pad, int) and 0 <= pad < self.vocab_size else None
        absolute = any(hasattr(cfg, k) for k in ("n_positions",)) or getattr(cfg, "position_embedding_type", "") == "absolute"
        self.max_len = getattr(cfg, "max_position_embeddings", None) if absolute else None

    def _uncached(self) -> dict:
        return {"use_cache": False} if _takes(self.module.forward, "use_cache") else {}   # older GPT, XLM: no cache

    def forward(self, x, mask=None, positions=None):
        kw = self._uncached()
        if mask is not None:
            kw["attention_mask"] = mask.long()
        if positions is not None:
            if "position_ids" not in _params(self.module.forward):
                raise Unsupported("needs position ids (its forward takes no position_ids)", "no_positions")
            kw["position_ids"] = positions
        if getattr(self, "_output_attentions", False):   # the output_attentions path (attention_path)
            kw["output_attentions"] = True
        return self.module(input_ids=x, **kw).logits

    def typed_forward(self, x, types, mask=None, labels=None):
        """The logits with token_type_ids, where the config declares image tokens: a run of 1s is an
        image (Gemma3), attended within itself; 0s PaliGemma's prefix. Elsewhere types mean other things
        (HRM's prefix LM: every 1 one block), which the doctor cannot tell from a forward: Unsupported.
        mask: the attention mask (None: none passed); labels: given where the forward takes them (a
        training call: the mask some releases build differs with labels)."""
        cfg = self.module.config
        if "token_type_ids" not in _params(self.module.forward):
            raise Unsupported("its forward takes no token_type_ids", "no_token_types")
        if not any(isinstance(getattr(cfg, k, None), int) for k in IMAGE_TOKEN):   # what a type means is declared
            raise Unsupported("its config declares no image token: what its token types mean is not declared "
                              "(a prefix LM's one block, a segment)", "no_token_types")
        kw = {} if mask is None else {"attention_mask": mask.long()}
        if labels is not None and "labels" in _params(self.module.forward):   # training: the loss's own inputs
            kw["labels"] = labels
        return self.module(input_ids=x, token_type_ids=types, **kw, **self._uncached()).logits

    def rows_forward(self, x, positions, mask=None):
        """The logits with position ids of several rows, (R, B, T) (M-RoPE's temporal, height and
        width), and the attention mask as given (None: no mask passed). Unsupported where the forward
        takes no position_ids; whether it reads R rows is the check's to measure."""
        if "position_ids" not in _params(self.module.forward):
            raise Unsupported("its forward takes no position_ids", "no_positions")
        kw = {} if mask is None else {"attention_mask": mask.long()}
        return self.module(input_ids=x, position_ids=positions, **kw, **self._uncached()).logits

    def image_token(self) -> int | None:
        """The image token its config declares (None: none declared)."""
        cfg = self.module.config
        return next((v for k in IMAGE_TOKEN if isinstance(v := getattr(cfg, k, None), int)), None)

    def own_image_forward(self, x, side, mask=None):
        """The logits of x, whose image tokens are one image of side x side merged patches, with the
        positions the model makes itself from the image's grid (transformers' image_grid_thw: 1 frame,
        side x the vision config's spatial merge rows and columns) and no pixels; the image run
        follows the config's vision start token. Unsupported where the forward takes no image grid;
        Unreachable where the config declares no merge size or start token to lay the image out by."""
        if "image_grid_thw" not in _params(self.module.forward):
            raise Unsupported("its forward takes no image grid (image_grid_thw)")
        cfg = self.module.config
        merge = getattr(getattr(cfg, "vision_config", None), "spatial_merge_size", None)
        if not isinstance(merge, int):
            raise Unreachable("its config declares no spatial_merge_size: the image grid of its tokens is not known")
        grid = torch.tensor([[1, side * merge, side * merge]], device=x.device).expand(x.shape[0], 3)
        kw = {} if mask is None else {"attention_mask": mask.long()}
        img = self.image_token()
        if "mm_token_type_ids" in _params(self.module.forward) and img is not None:   # 5.x: what a processor gives
            kw["mm_token_type_ids"] = (x == img).int()   # text 0, image 1 (its docstring's modalities)
        return self.module(input_ids=x, image_grid_thw=grid, **kw, **self._uncached()).logits

    def vision_start_token(self) -> int | None:
        """The token its config declares before an image's run (None: none)."""
        v = getattr(self.module.config, "vision_start_token_id", None)
        return v if isinstance(v, int) else None

    def _state_name(self) -> str:
        takes = _params(self.module.forward)
        return next((n for n in STATE_NAMES if n in takes), STATE_NAMES[0])

    def prefill(self, x):
        takes, name = _params(self.module.forward), self._state_name()
        if not _takes(self.module.forward, "use_cache") and not takes & CACHE_ARGS:
            raise Unsupported("no KV cache (its forward takes no use_cache or cache argument)", "no_kv_cache")
        out = self.module(input_ids=x, use_cache=True)
        if getattr(out, name, None) is None and name == "past_key_values" and name in takes:
            out = self._with_empty_cache(x) or out
        capacity = _capacity(getattr(out, name, None))
        if capacity is not None and capacity <= x.shape[1] and "cache_position" in takes:
            roomy = self._with_room(x, getattr(out, name))
            if roomy is not None:
                return roomy
        if getattr(out, name, None) is None and name in takes:   # a cache it fills in place (XLM's `cache`)
            filled = self._filled_in_place(x, name)
            if filled is not None:
                return filled
        if getattr(out, name, None) is None:
            own = sorted(takes & (CACHE_ARGS - {"use_cache", name}))
            if own or name in takes:   # a cache of its own kind (Mamba's cache_params, RWKV's state)
                raise Unreachable(f"use_cache=True returned no {name}; its forward takes "
                                  f"{', '.join(own or [name])}, a cache the doctor does not drive")
            raise Unsupported(f"no KV cache (use_cache=True returned no {name} and its forward takes no "
                              "cache argument)", "no_kv_cache")
        return getattr(out, name), out.logits

    def _with_empty_cache(self, x):
        """The prefill given an empty DynamicCache, as generate() gives one (Nemotron in 4.x makes none
        of its own), or None where the release has none or the model refuses it (then the cache
        stays one the doctor does not drive, never the target's failure)."""
        try:
            from transformers import DynamicCache
        except ImportError:
            return None
        try:
            return self.module(input_ids=x, use_cache=True, past_key_values=DynamicCache())
        except (TargetRaised, Exception):  # noqa: BLE001 -- a cache this model does not take: left undriven (inconclusive, unreachable)
            return None

    def _filled_in_place(self, x, name):
        """(InPlaceCache, logits) where the forward, given an empty DynamicCache under `name`, fills it
        in place with the prompt's tokens (XLM: its docstring's cache "modified in-place during the
        forward pass"; it returns none); None where it does not, or refuses one (undriven)."""
        try:
            from transformers import DynamicCache
            cache = DynamicCache()
            out = self.module(input_ids=x, **{name: cache}, use_cache=True)
            held = cache.get_seq_length()
        except (TargetRaised, Exception):  # noqa: BLE001 -- a cache object this model does not take: left undriven (inconclusive, unreachable), never the target's failure
            return None
        if held != x.shape[1] or out.logits.shape[1] != x.shape[1]:
            return None
        return InPlaceCache(cache, name, x), out.logits

    def _in_place_step(self, state, x):
        """A step into a cache filled in place: fed the new tokens, or where the forward does not read
        those as new (XLM takes the whole sequence and keeps what its cache lacks: fed the new tokens
        alone it reads none), the whole sequence; the one whose output is the new tokens' and that grows
        the cache by them, each tried on a copy of the cache."""
        n, seen, raised = x.shape[1], state.cache.get_seq_length(), None
        for fed in (x, torch.cat([state.tokens, x], 1)):
            cache = copy.deepcopy(state.cache)
            try:
                out = self.module(input_ids=fed, **{state.name: cache}, use_cache=True)
            except TargetRaised as e:   # fed what it does not read as new; the other way may be its protocol
                raised = raised or e
                continue
            if out.logits.shape[1] == n and cache.get_seq_length() == seen + n:
                return InPlaceCache(cache, state.name, torch.cat([state.tokens, x], 1)), out.logits
        if raised is not None:   # no way of feeding it held, and one raised: the target's
            raise raised
        raise Unreachable(f"a cache the forward fills in place under {state.name}: a step fed the new tokens, or the "
                          f"whole sequence, neither returned the {n} new tokens' outputs and grew the cache by them")

    def _with_room(self, x, cache):
        """A cache of fixed capacity that the model sized to the prompt (Gemma2's HybridCache in 4.4x,
        a StaticCache) takes no step: the prefill again into one of its class with room for the steps
        and their positions, as generate() builds it and passes cache_position (such a cache cannot
        count what it holds once a sliding layer wraps): (state, logits), or None where its class is
        not built so."""
        n = x.shape[1]
        try:
            p = next(self.module.parameters())
            room = type(cache)(config=self.module.config, max_batch_size=x.shape[0], max_cache_len=2 * n + 8,
                               device=p.device, dtype=p.dtype)
        except Exception:  # noqa: BLE001 -- a cache class not built from (config, max_batch_size, max_cache_len): None, the model's own cache kept, whose step then raises (fail: target_raised, as before this path); the class's refusal is no verdict of its own
            return None
        out = self.module(input_ids=x, use_cache=True, past_key_values=room,
                          cache_position=torch.arange(n, device=x.device))
        return FixedCache(out.past_key_values, n), out.logits

    def step(self, state, x):
        name = self._state_name()
        if isinstance(state, InPlaceCache):
            return self._in_place_step(state, x)
        if isinstance(state, FixedCache):   # one token at a time, as generate() decodes into these classes:
            logits = []                      # transformers refuses a multi-token step there (assisted generate:
            for i in range(x.shape[1]):      # "not supported with Static cache classes"), which 4.4x's sliding
                pos = torch.arange(state.seen, state.seen + 1, device=x.device)   # layers write at one slot
                out = self.module(input_ids=x[:, i:i + 1], past_key_values=state.cache, use_cache=True,
                                  cache_position=pos)
                state = FixedCache(out.past_key_values, state.seen + 1)
                logits.append(out.logits)
            return state, torch.cat(logits, 1)
        out = self.module(input_ids=x, **{name: state}, use_cache=True)
        return getattr(out, name), out.logits

    def _decoded(self, x, n, fed: list | None = None, **how):
        """The logits (B, n, V) of n tokens greedily decoded after x by generate() (`how`: its cache
        options), in a model put back after it: generate() may leave a cache there (4.39's _setup_cache on
        every layer, later releases' _cache). `fed`, where given, collects the tokens each forward was fed."""
        def seen(_, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            fed.append(ids.shape[1] if isinstance(ids, torch.Tensor) and ids.dim() == 2 else None)

        with restored(self.module):
            hook = self.module.register_forward_pre_hook(seen, with_kwargs=True) if fed is not None else None
            try:
                out = self.module.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                                           do_sample=False, output_logits=True, return_dict_in_generate=True,
                                           pad_token_id=self.pad_id or 0, eos_token_id=None, **how)
            finally:
                if hook is not None:
                    hook.remove()
        return torch.stack(out.logits, 1)

    def static_decode(self, x, n):
        """Greedy decoding of n tokens after the prompt x by generate(), through the StaticCache it builds
        for cache_implementation="static", and through the cache it grows by default (the same generate():
        its positions and masks, so that only the cache differs): each step's logits (B, n, V), both.
        Unsupported where the release or the model has no static cache (generate() refuses it before any
        forward), or where its generate() preallocates by default (Gemma2's hybrid in 4.4x): nothing
        grown to compare with."""
        if not hasattr(self.module, "generate"):
            raise Unsupported("no generate(): no static cache to decode through", "no_kv_cache")
        default = getattr(getattr(self.module, "generation_config", None), "cache_implementation", None)
        if default in PREALLOCATED:
            raise Unsupported(f"its generate() preallocates its cache by default ({default}): none grown to compare "
                              "with", "no_kv_cache")
        try:
            grown = self._decoded(x, n)
            return self._decoded(x, n, cache_implementation="static"), grown
        except Exception as e:  # noqa: BLE001 -- generate()'s own code refused (no static cache for this model or release; generate unusable here), not the model's forward (whose raise is TargetRaised, a fail): Unsupported, the static half n/a with generate's words in the detail, the rest of kv_cache stands
            raise Unsupported(f"generate(cache_implementation='static') refused: {str(e).splitlines()[0][:160]}",
                              "no_kv_cache") from None

    def generated_decode(self, x, n):
        """Greedy decoding of n tokens after the prompt x by generate() with its cache and without
        (use_cache=False), each step's logits (B, n, V), both: the driver of a cache of the model's own
        kind (Mamba's cache_params, RWKV's state), which generate() passes where the doctor cannot.
        Unreachable where generate() refuses, where the cached decoding still fed every step the whole
        sequence (the cache was never read: XLM), or where the uncached one fed only new tokens (it
        decodes with its cache either way: XLNet's mems)."""
        if not hasattr(self.module, "generate"):
            raise Unreachable("no generate() to drive its cache")
        fed = {True: [], False: []}   # the tokens each forward was fed, per run
        try:
            cached = self._decoded(x, n, fed[True], use_cache=True)   # the target raising here fails (TargetRaised)
            try:
                uncached = self._decoded(x, n, fed[False], use_cache=False)
            except TargetRaised as e:   # no reference: not the cache's failure
                raise Unreachable(f"generate(use_cache=False) raised: {e.error}") from None
        except Exception as e:  # noqa: BLE001 -- generate()'s own code refused (the model's forward raising is TargetRaised, a fail): Unreachable, kv_cache inconclusive with generate's words, as without this driver
            raise Unreachable(f"generate() refused to decode: {str(e).splitlines()[0][:160] if str(e) else type(e).__name__}") from None
        whole = {c: [isinstance(k, int) and k >= x.shape[1] + i for i, k in enumerate(fed[c])] for c in fed}
        if all(whole[True]):
            raise Unreachable(f"generate() fed every step the whole sequence (inputs of {fed[True]} tokens): "
                              "its cache was never read")
        if not all(whole[False]):
            raise Unreachable(f"generate(use_cache=False) still fed only new tokens (inputs of {fed[False]} tokens): "
                              "it decodes with its cache either way, nothing uncached to compare with")
        return cached, uncached

    def embedding(self):
        return self.module.get_input_embeddings()

    def converted(self, dtype=None, device=None):
        """The copy in `dtype`, its float32 parts kept as from_pretrained(dtype=...) keeps them: the
        model's _keep_in_fp32_modules in float16, its _keep_in_fp32_modules_strict in float16 and
        bfloat16 (globs searched in the parameter names, transformers' rule)."""
        new = super().converted(dtype=dtype, device=device)
        keep = [p for attr, dts in (("_keep_in_fp32_modules", (torch.float16,)),
                                    ("_keep_in_fp32_modules_strict", (torch.float16, torch.bfloat16)))
                if dtype in dts for p in (getattr(self.module, attr, None) or ()) if isinstance(p, str)]
        if keep:
            found = re.compile("|".join(p.replace("*", ".*") for p in keep))
            for n, t in [*new.module.named_parameters(), *new.module.named_buffers()]:
                if t.is_floating_point() and found.search(n):
                    t.data = t.data.float()
        return new

    @property
    def implementation(self) -> str:
        return getattr(self.module.config, "_attn_implementation", "eager")

    def paths(self):
        return attention_paths(self)

    @contextmanager
    def use_path(self, name):
        with attention_path(self, name):
            yield

    @contextmanager
    def reloaded(self):
        with saved_and_loaded(self) as b:
            yield b

    def windows(self):
        cfg = self.module.config
        return declared_windows(cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg)



# -- the attention paths of one set of weights (path_agreement) ----------------------------------
OUTPUT_ATTENTIONS = "output_attentions"   # the running implementation asked for the weights


def _rebuilt(adapter, impl):
    """The adapter's model with the same weights under implementation `impl`, for a release that
    fixes the implementation at build (no set_attn_implementation: transformers < 5); None where the
    release does not build it (it raises, or falls back to another implementation). Kept per model."""
    model = adapter.module
    cache = adapter.__dict__.setdefault("_rebuilt", {})
    key = (id(model), impl)
    if key not in cache:
        cfg = copy.deepcopy(model.config)
        # a built model's config is marked as checked; unmarked, the release asks of `impl` what it
        # asks on a user's from_config / from_pretrained (transformers 4.4x: a model without SDPA
        # refuses it; marked, it builds with a mask meant for SDPA layers it does not have)
        if getattr(cfg, "_attn_implementation_autoset", False):
            cfg._attn_implementation_autoset = False
        try:
            new = type(model)._from_config(cfg, attn_implementation=impl)
            new.load_state_dict(model.state_dict())
        except (ValueError, ImportError, NotImplementedError, TypeError, RuntimeError):
            new = None   # this release does not build the model under impl: no such path
        if new is not None and getattr(new.config, "_attn_implementation", impl) != impl:
            new = None
        cache[key] = None if new is None else moved(new, device=adapter.device, dtype=adapter.dtype).eval()
    return cache[key]


def _gives_weights(adapter) -> bool:
    """The model runs with output_attentions=True (a forward that takes it and does not raise)."""
    if not _takes(adapter.module.forward, "output_attentions"):
        return False
    x = torch.zeros(1, 4, dtype=torch.long, device=adapter.device)
    try:
        with torch.no_grad():
            adapter.module(input_ids=x, output_attentions=True)
    except (TargetRaised, ValueError, TypeError, NotImplementedError, RuntimeError):   # inside target_scope: TargetRaised
        return False   # the model refuses the weights: no such path (path_agreement compares the others)
    return True


def attention_paths(adapter) -> list[str]:
    """The implementations the model switches between (set_attn_implementation, or rebuilt with the
    same weights where the release has none), and output_attentions where the running implementation
    is not eager: asking for the weights makes some releases' SDPA layers run their eager forward."""
    model, current = adapter.module, adapter.implementation
    have = []
    for p in PATHS:
        if p == current:
            have.append(p)
        elif hasattr(model, "set_attn_implementation"):
            try:
                model.set_attn_implementation(p)
                have.append(p)
            except (ValueError, ImportError, NotImplementedError, AttributeError):
                pass
            finally:
                model.set_attn_implementation(current)
        elif _rebuilt(adapter, p) is not None:
            have.append(p)
    if current != "eager" and _gives_weights(adapter):
        have.append(OUTPUT_ATTENTIONS)
    return have if len(have) > 1 else []


@contextmanager
def attention_path(adapter, name):
    """A context in which the adapter runs path `name` (one of attention_paths)."""
    model, current = adapter.module, adapter.implementation
    if name == OUTPUT_ATTENTIONS:
        adapter._output_attentions = True
        try:
            yield
        finally:
            adapter._output_attentions = False
    elif name == current:
        yield
    elif hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
        try:
            yield
        finally:
            model.set_attn_implementation(current)
    else:
        adapter.module = _rebuilt(adapter, name)
        try:
            yield
        finally:
            adapter.module = model


# -- the model saved and loaded back (config_roundtrip) ------------------------------------------
@contextmanager
def saved_and_loaded(adapter):
    """An adapter of the model saved with save_pretrained into a temporary directory and loaded back
    with from_pretrained (its class, the same implementation and dtype; nothing downloaded). What
    saving or loading raises leaves the check unperformed (inconclusive), naming it."""
    import tempfile
    model = adapter.module
    with tempfile.TemporaryDirectory(prefix="doctor_roundtrip_") as d:
        try:
            model.save_pretrained(d)
            kw = {"attn_implementation": adapter.implementation} if adapter.implementation else {}
            new = type(model).from_pretrained(d, **kw)
        except Exception as e:  # noqa: BLE001 -- the library's save or load raised (not the forward): inconclusive, named
            raise NotPerformed(f"save_pretrained / from_pretrained raised {type(e).__name__}: "
                               f"{str(e).splitlines()[0][:160] if str(e) else ''}", "not_reloaded",
                               {"error": said(e)}) from None
        b = copy.copy(adapter)
        b.module = moved(new, device=adapter.device, dtype=adapter.dtype).eval()
        yield b
