"""The x-transformers zoo: every attention option of x-transformers' Attention / AttentionLayers
that a decoder-only LM accepts, one at a time, and the pairs of options that share code
(options.yaml says which and why), each in a small TransformerWrapper + Decoder with flash on and
off, examined by the attention doctor (`python -m doctor_lab.zoo_xt`); across releases with
`--release`."""
import hashlib
import json
from pathlib import Path

import yaml

TABLE = Path(__file__).with_name("options.yaml")
PATHS = ("flash", "einsum")


def load_table(path=TABLE) -> dict:
    """{"targets": name -> options, "notes": name -> note, "not_examined": option -> why}; a pair
    is named by its options joined with '+'."""
    t = yaml.safe_load(Path(path).read_text())
    targets, notes = {}, {}
    for name, v in t["options"].items():
        if isinstance(v, dict):
            targets[name] = {k: _value(x) for k, x in v["set"].items()}
            if v.get("note"):
                notes[name] = v["note"]
        else:
            targets[name] = {name: v}
    for p in t["pairs"]:
        name = "+".join(p["set"])
        if not p.get("why"):
            raise ValueError(f"{path}: pair {name} needs a `why` (the code the two options share)")
        targets[name] = {k: _value(x) for k, x in p["set"].items()}
        notes[name] = p["why"]
    return {"targets": targets, "notes": notes, "not_examined": t.get("not_examined", {})}


def _value(v):
    return tuple(v) if isinstance(v, list) else v   # x-transformers takes tuples (custom_layers, orders)


def entry_hash(name: str, table: dict) -> str:
    blob = json.dumps(table["targets"].get(name), sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def build(name: str, path: str, table: dict):
    """The adapter of target `name` on `path` (flash: attn_flash=True; einsum: the same model with
    flash off). Unsupported when x-transformers refuses flash with these options but builds them
    without; TargetError when it refuses them."""
    from attention_doctor import TargetError, Unsupported
    from attention_doctor.xtransformers import build as build_xt
    opts = dict(table["targets"][name])
    try:
        adapter = build_xt({**opts, "attn_flash": path == "flash"})
    except TargetError as e:
        if path != "flash":
            raise
        build_xt({**opts, "attn_flash": False})   # refused without flash too: a build error
        raise Unsupported(f"flash refused with these options: {str(e).split('refuses these options ')[-1]}") from None
    adapter.name = f"xt:{name} {path}"
    return adapter


def version() -> str:
    """The imported x-transformers' release (it has no __version__): its dist-info beside it."""
    import x_transformers
    site = Path(x_transformers.__file__).resolve().parents[1]
    found = sorted(p.name[len("x_transformers-"):-len(".dist-info")] for p in site.glob("x_transformers-*.dist-info"))
    return found[0] if len(found) == 1 else "unknown"
