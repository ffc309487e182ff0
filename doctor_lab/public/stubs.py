"""Placeholders for modules a public class's package imports but the model never uses (a cloud
client, a data loader, a tokenizer's native extension): each record names the ones it stubs and
why. A placeholder module answers any attribute with a placeholder class (an Exception subclass,
so that `except module.Error` still reads), or with a submodule stubbed beside it; a class
attribute the importing code reads at import time is given explicitly (`attrs`)."""
import sys
import types


class Placeholder(Exception):
    """Stands in for anything a stubbed module defines: constructible and callable, doing nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return self


def _module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []   # a package, so that `import name.sub` reaches a stubbed submodule

    def attribute(attr, _name=name):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return sys.modules.get(f"{_name}.{attr}") or type(attr, (Placeholder,), {})
    module.__getattr__ = attribute
    return module


def stub(*names: str, **attrs):
    """Stub each module not already imported; `attrs` are set on the last one."""
    for name in names:
        sys.modules.setdefault(name, _module(name))
    for attr, value in attrs.items():
        setattr(sys.modules[names[-1]], attr, value)
