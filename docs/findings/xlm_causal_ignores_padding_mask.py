"""XLMWithLMHeadModel with causal=True ignores the padding in attention: real tokens attend to left
pads. Exit 1 while they do (the bug), 0 when left padding leaves the real tokens' logits unchanged.

transformers 5.23.0 and 5.25.0, torch (CPU); random weights from a small config, no download; seconds. Run as is:
    python docs/findings/xlm_causal_ignores_padding_mask.py
get_masks() (modeling_xlm.py) returns the padding mask for the hidden states but, when causal, only
the causal triangle as the attention mask; the pads' hidden states are zeroed, yet as keys they
still take weight. With position ids from the mask the real tokens' logits must match the unpadded
run: they do with right padding (no real token sees a later pad), not with left padding.
"""
import sys

import torch
from transformers import XLMConfig, XLMWithLMHeadModel

TOL = 1e-5  # float32: the same sums with masked keys at weight exactly 0
torch.manual_seed(0)
cfg = XLMConfig(vocab_size=128, emb_dim=256, n_layers=2, n_heads=2, causal=True,   # head size 128, as xlm-clm-enfr-1024's
                max_position_embeddings=64)
m = XLMWithLMHeadModel(cfg).eval()
x = torch.randint(5, 128, (1, 10), generator=torch.Generator().manual_seed(1))
real = torch.ones(1, 10, dtype=torch.long)
pads = torch.zeros(1, 4, dtype=torch.long)
err = {}
with torch.no_grad():
    alone = m(input_ids=x).logits
    for side in ("right", "left"):
        ids = torch.cat([x, pads + cfg.pad_index] if side == "right" else [pads + cfg.pad_index, x], 1)
        mask = torch.cat([real, pads] if side == "right" else [pads, real], 1)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        y = m(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        y = y[:, :10] if side == "right" else y[:, 4:]
        err[side] = ((y - alone).abs().max() / alone.abs().max()).item()
        print(f"{side} padding (4 pads), position ids from the mask: real tokens' logits against the unpadded "
              f"run: expected <= {TOL:g}, actual {err[side]:.3g}")
ok = max(err.values()) <= TOL
print("OK: the padding mask reaches attention" if ok else "BUG: real tokens attend to left pads")
sys.exit(0 if ok else 1)
