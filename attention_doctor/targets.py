"""TARGET strings -> torch modules or Adapters: `pkg.mod:obj` (a module instance, an Adapter, a
class or a zero-argument factory of either), `hf:NAME` (a transformers causal LM of model type
NAME from a small config), `self:` and `self:KEY=VAL ...` (this project's LM from conf/ with Hydra
overrides, from inside a clone); and adapters built by another library's module here:
`xt:OPTION=VALUE,...` (x-transformers), `diffusers:PROCESSOR[,cross]`."""
import importlib
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
        mod = importlib.import_module(mod_name)
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
