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


def next_key_visible():
    """Planted, at nanochat's own init (its output projections zero): the attention mask lets each
    query see the next key too (key j visible to query i where j <= i + 1), through the SDPA path
    nanochat takes on CPU (nanochat.flash_attention._sdpa_attention)."""
    import nanochat.flash_attention as fa
    import torch.nn.functional as F

    def leaky(q, k, v, window_size, enable_gqa):
        rows = (k.size(2) - q.size(2)) + torch.arange(q.size(2), device=q.device)[:, None]
        keep = torch.arange(k.size(2), device=q.device)[None, :] <= rows + 1
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=enable_gqa)
    fa._sdpa_attention = leaky
    return small()
