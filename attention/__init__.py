"""Attention mechanics with every failure toggle, the small LM, and diagnostics.

No training code lives here: the package imports on its own. Names load on first use, so
`attention.variance` (plain Python) is importable without torch.
"""
import importlib

_WHERE = {"AttentionConfig": "attention.config", "KVCache": "attention.mha", "MultiHeadAttention": "attention.mha",
          "ModelConfig": "attention.config", "TransformerLM": "attention.lm"}
__all__ = list(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'attention' has no attribute {name!r}")
