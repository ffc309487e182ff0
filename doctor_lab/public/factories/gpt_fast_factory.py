"""gpt-fast's `Transformer` (model.py), small with random weights; its forward needs `input_pos`
and a cache set up first (setup_caches), which this factory does not call: the doctor must. Needs
the checkout on PYTHONPATH. Nothing stubbed."""
import torch
from model import ModelArgs, Transformer


def small():
    torch.manual_seed(0)
    return Transformer(ModelArgs(block_size=4224, vocab_size=64, n_layer=2, n_head=4, n_local_heads=2, dim=32,
                                 intermediate_size=64)).eval()
