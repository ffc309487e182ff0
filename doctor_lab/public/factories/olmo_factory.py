"""AllenAI OLMo's `OLMo` (olmo/model.py), small with random weights, RoPE; its forward takes
`past_key_values`/`use_cache` and returns per-layer (k, v) presents. Needs the checkout on
PYTHONPATH. Stubbed (imported by olmo/util.py, olmo/tokenizer.py and olmo/data for checkpoints,
cloud storage and datasets, none used by a forward): boto3, botocore, cached_path (its
SchemeClient given the one class attribute olmo/util.py reads at import), datasets,
google.api_core (not the google namespace: protobuf lives there), olmo_data."""
import torch

from doctor_lab.public.stubs import stub

stub("boto3", "botocore", "botocore.config", "botocore.exceptions")
stub("cached_path", "cached_path.schemes", SchemeClient=type("SchemeClient", (), {"recoverable_errors": ()}))
stub("datasets", "google.api_core", "google.api_core.retry", "olmo_data", "olmo_data.data")

import olmo.model as olmo_model  # noqa: E402
from olmo.config import ModelConfig  # noqa: E402


def small():
    torch.manual_seed(0)
    return olmo_model.OLMo(ModelConfig(d_model=32, n_heads=4, n_layers=2, max_sequence_length=4224, vocab_size=64,
                                       embedding_size=64, rope=True, attention_dropout=0.0, residual_dropout=0.0,
                                       embedding_dropout=0.0, init_device="cpu", weight_tying=False)).eval()


def cache_top_left():
    """Planted: on a step after the prompt, the new queries take the causal bias's first rows
    (top-left) instead of the rows after the cached keys."""
    attention = olmo_model.OLMoBlock.attention

    def top_left(self, q, k, v, attention_bias=None, layer_past=None, use_cache=False, **kw):
        if attention_bias is not None and layer_past is not None:
            attention_bias = torch.roll(attention_bias, layer_past[0].shape[-2], dims=2)
        return attention(self, q, k, v, attention_bias=attention_bias, layer_past=layer_past, use_cache=use_cache, **kw)
    olmo_model.OLMoBlock.attention = top_left
    return small()
