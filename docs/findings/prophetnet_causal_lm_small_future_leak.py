"""ProphetNetForCausalLM's logits at early positions move (by ~1e-5 relative) when later tokens change.

transformers 5.23.0, torch (CPU, float32); random weights from a small config, no download. Run as is:
    python docs/findings/prophetnet_causal_lm_small_future_leak.py
Exact causality gives exactly 0 (the zoo measures exactly 0 for BartForCausalLM, GPT-2 and Llama).
The change is small but not rounding: it is there at positions 0..3 when tokens from 1, 2 or 4
on change, and gone when only tokens from 8 on change; the gradient of an early logit with respect
to a later input embedding is not zero either. Where it enters (the n-gram self-attention's main or
predict stream, or its relative position buckets) is not located here.
"""
import torch
from transformers import ProphetNetConfig, ProphetNetForCausalLM

torch.manual_seed(0)
cfg = ProphetNetConfig(vocab_size=128, hidden_size=64, num_encoder_layers=2, num_decoder_layers=2,
                       num_encoder_attention_heads=4, num_decoder_attention_heads=4,
                       encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=512)
m = ProphetNetForCausalLM(cfg).eval()
g = torch.Generator().manual_seed(1)
x = torch.randint(3, 128, (2, 16), generator=g)
with torch.no_grad():
    y = m(input_ids=x).logits
    for t in (1, 2, 4, 8):
        x2 = x.clone()
        x2[:, t:] = torch.randint(3, 128, (2, 16 - t), generator=g)
        d = (m(input_ids=x2).logits[:, :t] - y[:, :t]).abs().max() / y[:, :t].abs().max()
        print(f"tokens from {t} on replaced: relative change of the logits before {t}: {d.item():.3g}")
emb = m.get_input_embeddings()(x).detach().requires_grad_(True)
out = m(inputs_embeds=emb).logits
out[:, 0].sum().backward()
print(f"|d logits[0] / d embedding[1:]| max: {emb.grad[:, 1:].abs().max().item():.3g} (0 if causal)")
