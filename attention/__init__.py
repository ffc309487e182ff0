"""Attention mechanics with every failure toggle, the small LM, and diagnostics.

No training code lives here: the package imports on its own.
"""
from attention.mha import AttentionConfig, KVCache, MultiHeadAttention
from attention.lm import ModelConfig, TransformerLM

__all__ = ["AttentionConfig", "KVCache", "MultiHeadAttention", "ModelConfig", "TransformerLM"]
