"""Which built-in adapter drives a module (its own module: the adapters for transformers and this
project import the base protocol, and this chooses among them)."""
import torch.nn as nn

from attention_doctor.adapters import Adapter, Layer, TargetError, TorchMHA
from attention_doctor.conventions import CallableLM, token_embedding


def adapt(obj, causal=None, **kw) -> Adapter:
    """The built-in adapter for obj: an Adapter as is; transformers' causal LMs; x-transformers'
    TransformerWrapper; diffusers' attention modules (self-attention); this project's LM and layer;
    nn.MultiheadAttention; else a module with an embedding table is a causal LM (forward(ids), its
    conventions found: conventions.py), anything else a layer (forward(x))."""
    if isinstance(obj, Adapter):
        return obj
    if not isinstance(obj, nn.Module):
        raise TargetError(f"{type(obj).__name__} is not a torch.nn.Module")
    mro = {c.__module__.split(".")[0] + "." + c.__name__ for c in type(obj).__mro__}
    if "transformers.PreTrainedModel" in mro:
        from attention_doctor.hf_seq2seq import HFSeq2SeqLM, is_seq2seq
        if is_seq2seq(obj):   # an encoder-decoder: the decoder driven as the LM, the encoder input beside it
            return HFSeq2SeqLM(obj, **kw)
        from attention_doctor.hf import HFCausalLM
        return HFCausalLM(obj, **kw)
    if "x_transformers.TransformerWrapper" in mro:
        from attention_doctor.xtransformers import XTransformersLM
        return XTransformersLM(obj, **kw)
    if any(m.startswith("diffusers.") for m in mro) and hasattr(obj, "processor"):
        from attention_doctor.diffusers import DiffusersAttention
        return DiffusersAttention(obj, **kw)
    if "attention.TransformerLM" in mro or "attention.MultiHeadAttention" in mro:
        from attention_doctor.project import adapt_project
        return adapt_project(obj, **kw)
    if isinstance(obj, nn.MultiheadAttention):
        return TorchMHA(obj, causal=bool(causal), **kw)
    if token_embedding(obj) is not None:
        return CallableLM(obj, **kw)
    return Layer(obj, causal=causal, **kw)
