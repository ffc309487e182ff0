"""x-transformers: token shifting (Decoder(shift_tokens=1)) moves a left-padded row's pad features
into its first real token: the feedforward blocks' ShiftTokens get no mask. Exit 1 while the real
tokens of a left-padded row differ from the unpadded row's, 0 once they agree.

x-transformers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/xt_shift_tokens_feedforward_mask.py
ShiftTokens zeroes masked positions before shifting (shift(t, amount, mask)), but it finds the mask
in its kwargs, and AttentionLayers.forward calls the feedforward blocks with deep_embed only: there
the pads' features shift into the first real token. Rotary positions (relative) keep positions out
of the comparison.
"""
import sys

import torch
from x_transformers import Decoder, TransformerWrapper

TOL = 1e-5
real = torch.randint(1, 64, (2, 12), generator=torch.Generator().manual_seed(1))
P = 4
padded = torch.cat([torch.zeros(2, P, dtype=torch.long), real], 1)
mask = torch.cat([torch.zeros(2, P, dtype=torch.bool), torch.ones(2, 12, dtype=torch.bool)], 1)
ok = True
for opts in ({}, {"shift_tokens": 1}):
    torch.manual_seed(0)
    model = TransformerWrapper(num_tokens=64, max_seq_len=0, attn_layers=Decoder(
        dim=32, depth=2, heads=4, attn_dim_head=8, rotary_pos_emb=True, **opts)).eval()
    with torch.no_grad():
        ref = model(real)
        got = model(padded, mask=mask)[:, P:]
    err = float((got - ref).abs().max() / ref.abs().max())
    ok &= err <= TOL
    print(f"{opts or 'no token shift'}, left padding by {P} with its mask: real tokens against the unpadded rows: "
          f"expected <= {TOL:g}, actual {err:.3g}")
print("OK" if ok else "BUG: the feedforward's token shift moves pad features into real tokens (no mask)")
sys.exit(0 if ok else 1)
