"""XLMWithLMHeadModel with causal=True ignores the attention mask in attention: real tokens attend
to left pads.

transformers 5.23.0, torch (CPU); random weights from a small config, no download. Run as is:
    python docs/findings/xlm_causal_ignores_padding_mask.py
get_masks() returns the padding mask for the hidden states but, when causal, only the causal
triangle for attention; pads' hidden states are zeroed, yet their keys (bias terms) still take
weight. With position ids taken from the mask the real tokens' logits should match the unpadded
run; they do with right padding, not with left padding.
"""
import torch
from transformers import XLMConfig, XLMWithLMHeadModel

torch.manual_seed(0)
cfg = XLMConfig(vocab_size=128, emb_dim=64, n_layers=2, n_heads=4, causal=True, max_position_embeddings=64)
m = XLMWithLMHeadModel(cfg).eval()
g = torch.Generator().manual_seed(1)
x = torch.randint(5, 128, (1, 10), generator=g)
pad = cfg.pad_index
real = torch.ones(1, 10, dtype=torch.long)
with torch.no_grad():
    alone = m(input_ids=x).logits
    for side in ("right", "left"):
        if side == "right":
            ids = torch.cat([x, torch.full((1, 4), pad)], 1)
            mask = torch.cat([real, torch.zeros(1, 4, dtype=torch.long)], 1)
        else:
            ids = torch.cat([torch.full((1, 4), pad), x], 1)
            mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), real], 1)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        y = m(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        y = y[:, :10] if side == "right" else y[:, 4:]
        print(f"{side} padding, position ids from the mask: real tokens against unpadded "
              f"{((y - alone).abs().max() / alone.abs().max()).item():.3g}")
