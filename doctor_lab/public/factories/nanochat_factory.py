"""nanochat's `GPT` (nanochat/gpt.py), small with random weights from its own init_weights, its
engine imported so that the `KVCache` class its forward takes (`kv_cache=`) is there to be found.
Needs the checkout on PYTHONPATH. Stubbed (the tokenizer's, unused by a forward): rustbpe,
tiktoken."""
import torch

from doctor_lab.public.stubs import stub

stub("rustbpe", "tiktoken")

import nanochat.engine  # noqa: E402, F401  (KVCache lives there)
from nanochat.gpt import GPT, GPTConfig  # noqa: E402


def small():
    torch.manual_seed(0)
    model = GPT(GPTConfig(sequence_len=64, vocab_size=64, n_layer=2, n_head=4, n_kv_head=2, n_embd=32))
    model.init_weights()
    return model.eval()


def smear_on():
    """As a trained checkpoint has it: the token shift on (smear_lambda 0.5; init_weights zeroes
    it, and at 0 a step's smear has no effect, so karpathy/nanochat#756 cannot show)."""
    model = small()
    with torch.no_grad():
        model.smear_lambda.fill_(0.5)
    return model
