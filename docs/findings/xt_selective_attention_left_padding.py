"""x-transformers: selective attention (Decoder(attn_selective=True)) never lets a token mask key 0,
the start of the sequence; in a left-padded row key 0 is a pad and the real first token can be
masked: its real tokens differ from the unpadded row's. Exit 1 while they do, 0 once they agree.

x-transformers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/xt_selective_attention_left_padding.py
selective_attn (attend.py) exempts column -i of its gate (no_mask_sos) whatever the mask says; it is
called without the mask. Rotary positions (relative) keep positions out of the comparison.
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
for opts in ({}, {"attn_selective": True}):
    torch.manual_seed(0)
    model = TransformerWrapper(num_tokens=64, max_seq_len=0, attn_layers=Decoder(
        dim=256, depth=2, heads=4, attn_dim_head=64, rotary_pos_emb=True, **opts)).eval()
    with torch.no_grad():
        ref = model(real)
        got = model(padded, mask=mask)[:, P:]
    err = float((got - ref).abs().max() / ref.abs().max())
    ok &= err <= TOL
    print(f"{opts or 'plain attention'}, left padding by {P} with its mask: real tokens against the unpadded rows: "
          f"expected <= {TOL:g}, actual {err:.3g}")
print("OK" if ok else "BUG: selective attention keeps key 0 (a pad when left-padded) instead of the row's first real token")
sys.exit(0 if ok else 1)
