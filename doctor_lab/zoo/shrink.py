"""A small config for each architecture: the generic shrink and the per-architecture table of
shrink.yaml (beside this file) applied to transformers' default config. No download."""
import hashlib
import inspect
import json
from pathlib import Path

import yaml

TABLE = Path(__file__).with_name("shrink.yaml")


class NotExamined(Exception):
    """The shrink table says this architecture is not examined (the message says why)."""


# generic sizes whose unset default (None) switches the feature off: shrunk only where the default sets
# one (a window of 16 on Minimax or Nemotron-H, whose defaults have none, would examine another model)
SWITCHED_BY_VALUE = {"sliding_window"}


def load_table(path=TABLE) -> dict:
    t = yaml.safe_load(Path(path).read_text())
    t.setdefault("archs", {})
    for arch, e in t["archs"].items():
        if not isinstance(e, dict) or not (e.get("why") or e.get("skip")):
            raise ValueError(f"{path}: entry {arch!r} needs a `why` (or a `skip` reason)")
    return t


def with_init(table: dict, archs, values: dict) -> dict:
    """The table with `values` given to each of `archs`' configs at construction, over its own entry
    (a condition a caller needs, e.g. a window where the default sets none: the backtest's record);
    their results are keyed apart (entry_hash)."""
    if not values:
        return table
    out = {**table, "archs": dict(table["archs"])}
    for a in archs:
        e = dict(out["archs"].get(a) or {"why": "values given by the caller"})
        e["init"] = {**(e.get("init") or {}), **values}
        out["archs"][a] = e
    return out


def parse_values(pairs) -> dict:
    """KEY=VALUE strings -> {KEY: VALUE}, each value read as YAML (16, true, null, a string);
    ValueError (one line) for a pair without '='."""
    out = {}
    for p in pairs or ():
        k, eq, v = p.partition("=")
        if not eq or not k.strip():
            raise ValueError(f"{p!r}: give KEY=VALUE (e.g. sliding_window=16)")
        out[k.strip()] = yaml.safe_load(v)
    return out


def entry_hash(arch: str, table: dict) -> str:
    """Changes when the shrink that builds `arch` changes: its result is then stale."""
    blob = json.dumps([table["generic"], table["archs"].get(arch)], sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def _known(cfg) -> set:
    """The names a config answers to: its own keys and its attribute_map's aliases."""
    return set(cfg.to_dict()) | set(getattr(cfg, "attribute_map", {}) or {})


def _per_layer(d: dict) -> set:
    """Keys a config derives from its depth (lists with one entry per layer, per-layer configs):
    left out of a sub-config's dict so the shrunk config derives them again for its own depth."""
    n = d.get("num_hidden_layers")
    return {k for k, v in d.items() if k == "per_layer_config" or (isinstance(v, list) and len(v) == n and n)}


def _sub_configs(cfg) -> list[str]:
    """The names of a composite config's sub-configs: its sub_configs, or in releases before that
    attribute (4.4x's PaliGemma), its attributes that are configs themselves (text_config, ...)."""
    named = getattr(cfg, "sub_configs", None)
    if named:
        return list(named)
    return [k for k, v in vars(cfg).items() if not k.startswith("_") and hasattr(v, "to_dict") and hasattr(v, "model_type")]


def _taken(cls, kw: dict) -> dict:
    """kw as a sub-config class takes it: whole where the class builds from it, else only the keys its
    __init__ names (4.4x-5.0's DbrxAttentionConfig raises "Found unknown kwargs" on the base config's
    generic keys, return_dict, is_decoder, ..., that to_dict() gives back)."""
    try:
        cls(**kw)
        return kw
    except Exception:  # noqa: BLE001 -- a class that rejects the dict: given what it names (make_config still raises, as before, if that fails too)
        names = set(inspect.signature(cls.__init__).parameters)
        return {k: v for k, v in kw.items() if k in names}


def _shrunk_kwargs(cfg, generic: dict, extra: dict) -> dict:
    kw = {k: v for k, v in generic.items() if k in _known(cfg)
          and not (k in SWITCHED_BY_VALUE and getattr(cfg, k, None) in (None, False))}
    for sub in _sub_configs(cfg):
        s = getattr(cfg, sub, None)
        if s is not None and hasattr(s, "to_dict"):
            d = s.to_dict()
            d = {k: v for k, v in d.items() if k not in _per_layer(d)}
            kw[sub] = _taken(type(s), {**d, **_shrunk_kwargs(s, generic, extra.get(sub, {}))})
    kw.update({k: v for k, v in extra.items() if not isinstance(v, dict) or k not in kw})
    return kw


def _fix_derived(cfg, generic: dict, kw: dict):
    """head_dim from the shrunk width; special-token ids inside the shrunk vocabulary."""
    d = cfg.to_dict()
    if "head_dim" in d and "head_dim" not in kw and isinstance(d.get("num_attention_heads"), int):
        cfg.head_dim = d["hidden_size"] // d["num_attention_heads"]
    if "query_pre_attn_scalar" in d and "query_pre_attn_scalar" not in kw:
        # Gemma 2/3 scale scores by query_pre_attn_scalar ** -0.5, 256 by default: their default
        # head_dim. Left at 256 beside a 16-wide head, scores would be 4x too small.
        cfg.query_pre_attn_scalar = getattr(cfg, "head_dim", None) or d["hidden_size"] // d["num_attention_heads"]
    _fit_mrope(cfg)
    vocab = d.get("vocab_size")
    for k in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        v = d.get(k)
        if isinstance(vocab, int) and isinstance(v, int) and v >= vocab:
            setattr(cfg, k, vocab - 1)
        elif isinstance(vocab, int) and isinstance(v, list):
            setattr(cfg, k, [min(i, vocab - 1) for i in v])
    for sub in _sub_configs(cfg):
        s = getattr(cfg, sub, None)
        if s is not None and hasattr(s, "to_dict"):
            _fix_derived(s, generic, kw.get(sub, {}) if isinstance(kw.get(sub), dict) else {})


def _fit_mrope(cfg):
    """M-RoPE's sections (rotary frequencies per position row: temporal, height, width) sum to half the
    head dim: rescaled to the shrunk head, each row kept at least 1 (Qwen2-VL's [16, 24, 24] -> [2, 3, 3])."""
    d = cfg.to_dict()
    heads, width = d.get("num_attention_heads"), d.get("hidden_size")
    head = d.get("head_dim") or (width // heads if isinstance(width, int) and isinstance(heads, int) else None)
    for key in ("rope_scaling", "rope_parameters"):
        rope = getattr(cfg, key, None)
        sec = rope.get("mrope_section") if isinstance(rope, dict) else None
        if not isinstance(head, int) or not isinstance(sec, list) or not sec or sum(sec) == head // 2:
            continue
        half = head // 2
        new = [max(1, round(s * half / sum(sec))) for s in sec]
        new[0] += half - sum(new)
        rope["mrope_section"] = new


def _set(cfg, dotted: str, value):
    *path, name = dotted.split(".")
    for p in path:
        cfg = getattr(cfg, p)
    setattr(cfg, name, value)


def overlay(kw: dict, options: dict) -> dict:
    """kw with `options` over it; `sub.field` (an option of a sub-config: text_config.attention_bias)
    goes into kw[sub], a dict of that sub-config's values, beside the values already there."""
    for k, v in options.items():
        head, dot, rest = k.partition(".")
        if dot:
            kw[head] = overlay(dict(kw[head]) if isinstance(kw.get(head), dict) else {}, {rest: v})
        else:
            kw[k] = v
    return kw


def per_layer(value) -> bool:
    """A value given per layer (a list: layer_types), which only the shrunk depth can take."""
    return isinstance(value, (list, tuple))


def make_config(arch: str, table: dict | None = None, options: dict | None = None):
    """The shrunk config of `arch`; NotExamined when the table skips it. options (the option zoo's,
    doctor_lab/zoo/options.py): config values that change the family's default before it is shrunk,
    so that what they switch on is shrunk as every default is (use_sliding_window's 4096-token window
    becomes the table's 16), and given again over the shrink; a per-layer list is given at the shrunk
    depth only."""
    from transformers import AutoConfig
    table = table or load_table()
    entry = table["archs"].get(arch) or {}
    if entry.get("skip"):
        raise NotExamined(entry["skip"])
    init = entry.get("init", {})
    options = options or {}
    before = {k: v for k, v in options.items() if not per_layer(v)}
    try:
        default = AutoConfig.for_model(arch, **overlay({}, before))
    except Exception:  # noqa: BLE001  a default that fails its own validator: the entry's init repairs it (else raises)
        default = AutoConfig.for_model(arch, **overlay(dict(init), before))
    kw = overlay(_shrunk_kwargs(default, table["generic"], init), options)
    cfg = AutoConfig.for_model(arch, **kw)
    # an option's own value is given, not derived: query_pre_attn_scalar=4 stays 4
    _fix_derived(cfg, table["generic"], overlay({**init, **entry.get("set", {})}, options))
    for k, v in entry.get("set", {}).items():
        _set(cfg, k, v)
    return getattr(cfg, entry["use"]) if entry.get("use") else cfg
