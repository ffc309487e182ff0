"""x-transformers: token shifting (Decoder(shift_tokens=1)) moves a left-padded row's pad features
into its first real token. ShiftTokens zeroes the masked positions before it shifts, but it finds the
mask in its block's `mask` argument: the feedforward blocks get none, and with the padding given as
`seq_start_pos` (what generate passes for ragged prompts) no block gets one. Exit 1 while the real
tokens of a left-padded row differ from the unpadded row's, by either route, 0 once they agree.

x-transformers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/xt_shift_tokens_feedforward_mask.py
AttentionLayers.forward calls the feedforward blocks with deep_embed only, and folds seq_start_pos
into the attention's key mask (self_attn_kv_mask) only, never into `mask`. Rotary positions
(relative) keep positions out of the comparison.
"""
import sys

import torch
from x_transformers import Decoder, TransformerWrapper

TOL = 1e-5
real = torch.randint(1, 64, (2, 12), generator=torch.Generator().manual_seed(1))
P = 4
padded = torch.cat([torch.zeros(2, P, dtype=torch.long), real], 1)
routes = {"mask": {"mask": torch.cat([torch.zeros(2, P, dtype=torch.bool), torch.ones(2, 12, dtype=torch.bool)], 1)},
          "seq_start_pos": {"seq_start_pos": torch.tensor([P, P])}}
ok = True
for opts in ({}, {"shift_tokens": 1}):
    torch.manual_seed(0)   # x-transformers' default head size (attn_dim_head 64)
    model = TransformerWrapper(num_tokens=64, max_seq_len=0, attn_layers=Decoder(
        dim=128, depth=2, heads=2, attn_dim_head=64, rotary_pos_emb=True, **opts)).eval()
    with torch.no_grad():
        ref = model(real)
        for route, kw in routes.items():
            got = model(padded, **kw)[:, P:]
            err = float((got - ref).abs().max() / ref.abs().max())
            ok &= err <= TOL
            print(f"{opts or 'no token shift'}, left padding by {P} as {route}: real tokens against the unpadded rows: "
                  f"expected <= {TOL:g}, actual {err:.3g}")
print("OK" if ok else "BUG: token shifting moves pad features into real tokens (its blocks get no mask)")
sys.exit(0 if ok else 1)
