"""TARGET strings -> torch modules or Adapters: `pkg.mod:obj` or `path/to/file.py:obj` (a module
instance, an Adapter, a class or a zero-argument factory of either), `hf:NAME` (a transformers causal LM of model type
NAME from a small config), `self:` and `self:KEY=VAL ...` (this project's LM from conf/ with Hydra
overrides, from inside a clone); and adapters built by another library's module here:
`xt:OPTION=VALUE,...` (x-transformers), `diffusers:PROCESSOR[,cross]`."""
import importlib
import importlib.util
import shlex
import sys
from pathlib import Path

import torch.nn as nn

from attention_doctor.adapters import Adapter, TargetError

# PREFIX: (the module here whose target(spec) returns an Adapter, the pip package it needs)
LIBRARIES = {"xt": ("attention_doctor.xtransformers", "x-transformers"),
             "diffusers": ("attention_doctor.diffusers", "diffusers")}


def resolve(target: str, attn_impl: str | None = None):
    """The module (or Adapter) a TARGET string names. Every way it can fail is a TargetError (one
    line; a missing transformers names the command that installs it)."""
    prefix, sep, spec = target.partition(":")
    if sep and prefix in LIBRARIES and not attn_impl:
        return _library(prefix, spec)
    if target.startswith("hf:"):
        if not target[3:]:
            raise TargetError("hf: needs a model type, e.g. hf:llama or hf:gpt2")
        from attention_doctor.hf import build
        try:
            return build(target[3:], attn_impl)
        except TargetError as e:
            raise TargetError(str(e) if str(e).startswith(target) else f"{target}: {e}") from None
    if attn_impl:
        raise TargetError("--attn-impl applies to hf: targets only")
    if target.startswith("self:"):
        from attention_doctor.project import build_self
        return build_self(shlex.split(target[5:]))
    if ":" not in target:
        raise TargetError(f"{target}: a target is pkg.module:object, hf:NAME, self:[KEY=VAL ...], "
                          "xt:OPTION=VALUE,... or diffusers:PROCESSOR[,cross]")
    mod_name, _, attr = target.partition(":")
    if str(Path.cwd()) not in sys.path:   # a user's own module beside them, as `python -m` would
        sys.path.insert(0, str(Path.cwd()))
    try:
        mod = _from_file(target, mod_name) if _is_path(mod_name) else importlib.import_module(mod_name)
    except TargetError:
        raise
    except Exception as e:  # noqa: BLE001 -- the user's module does not import: TargetError (exit 2, one line naming it), no traceback
        fix = ""
        if isinstance(e, ModuleNotFoundError) and e.name == "transformers":
            from attention_doctor.hf import INSTALL
            fix = f": {INSTALL}"
        raise TargetError(f"{target}: cannot import {mod_name} ({type(e).__name__}: {e}){fix}") from None
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TargetError(f"{target}: {mod_name} has no {attr}")
        obj = getattr(obj, part)
    if isinstance(obj, (nn.Module, Adapter)):
        return obj
    if callable(obj):
        try:
            obj = obj()
        except Exception as e:  # noqa: BLE001 -- the user's factory raised: TargetError (exit 2, one line), no traceback
            raise TargetError(f"{target}: calling {attr}() raised {type(e).__name__}: {e}") from None
    if not isinstance(obj, (nn.Module, Adapter)):
        raise TargetError(f"{target}: {attr} is a {type(obj).__name__}, not a torch.nn.Module or an "
                          "attention_doctor.Adapter (nor a class or zero-argument factory of one)")
    return obj


def _is_path(mod_name: str) -> bool:
    return mod_name.endswith(".py") or "/" in mod_name or "\\" in mod_name


def _from_file(target: str, path: str):
    """The module of a file path (`cases/bmm_lm.py:healthy`), imported as `python cases/bmm_lm.py`
    would run it: its folder first on sys.path, so that its own sibling imports resolve."""
    file = Path(path if path.endswith(".py") else path + ".py").resolve()
    if not file.is_file():
        dotted = path.removesuffix(".py").replace("/", ".").replace("\\", ".")
        raise TargetError(f"{target}: no file {path} (a target is a file path or the dotted form, {dotted}:...)")
    if str(file.parent) not in sys.path:
        sys.path.insert(0, str(file.parent))
    spec = importlib.util.spec_from_file_location(file.stem, file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[file.stem] = mod   # dataclasses and pickling look their module up by name
    try:
        spec.loader.exec_module(mod)
    except BaseException:   # cleanup only, re-raised as it came: a half-run module must not stay importable
        sys.modules.pop(file.stem, None)
        raise
    return mod


def _library(prefix: str, spec: str):
    module, package = LIBRARIES[prefix]
    try:
        return importlib.import_module(module).target(spec)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] == package.replace("-", "_"):
            raise TargetError(f"{prefix}: needs {package} (pip install {package})") from None
        raise TargetError(f"{prefix}: {package} cannot be imported ({e})") from None
    except ImportError as e:
        raise TargetError(f"{prefix}: {package} cannot be imported ({e})") from None
