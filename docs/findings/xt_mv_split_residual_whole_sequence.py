"""x-transformers: the MV-split residual update (Decoder(mv_split_residual=True)) averages over the
whole sequence, so a causal Decoder's earlier outputs depend on later tokens (the future leaks into
every position). Exit 1 while they do, 0 once earlier outputs ignore later tokens.

x-transformers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/xt_mv_split_residual_whole_sequence.py
MVSplitResidualUpdate.forward takes masked_mean(x, dim=-2) and masked_mean(residual, dim=-2): the mean
of every position, later ones included, added back at each position.
"""
import sys

import torch
from x_transformers import Decoder, TransformerWrapper

TOL = 1e-6
x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
later = x.clone()
later[:, 8:] = (later[:, 8:] + 1) % 64   # the tokens from position 8 on replaced
ok = True
for opts in ({}, {"mv_split_residual": True}):
    torch.manual_seed(0)
    model = TransformerWrapper(num_tokens=64, max_seq_len=64, attn_layers=Decoder(
        dim=256, depth=2, heads=4, attn_dim_head=64, **opts)).eval()
    with torch.no_grad():
        a, b = model(x)[:, :8], model(later)[:, :8]
    err = float((a - b).abs().max() / a.abs().max())
    ok &= err <= TOL
    print(f"{opts or 'default residual'}: outputs at positions 0-7 with tokens 8-15 replaced, relative change: "
          f"expected <= {TOL:g}, actual {err:.3g}")
print("OK" if ok else "BUG: the MV-split residual's means cover the whole sequence: the future leaks into a causal Decoder")
sys.exit(0 if ok else 1)
