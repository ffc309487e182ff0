"""lingua's `LMTransformer` (apps/main/transformer.py), small with random weights from its own
init_weights; its `mask` goes to SDPA as `attn_mask` (attn_impl "sdpa", its default). Needs the
checkout on PYTHONPATH (the repository root: `apps` and `lingua` are packages there). Stubbed:
xformers (its fmha is the "fmha" attn_impl's, not used by "sdpa"; lingua imports it at the top)."""
import torch

from doctor_lab.public.stubs import stub

stub("xformers", "xformers.ops")

from apps.main.transformer import LMTransformer, LMTransformerArgs  # noqa: E402


def small():
    torch.manual_seed(0)
    model = LMTransformer(LMTransformerArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, multiple_of=16,
                                            max_seqlen=4224))
    model.init_weights()
    return model.eval()
