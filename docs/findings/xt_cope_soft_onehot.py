"""x-transformers: contextual position encoding with soft one-hot positions (attn_use_cope=True,
attn_cope_soft_onehot_pos=True) raises on every forward. Exit 1 while it does, 0 once it runs.

x-transformers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/xt_cope_soft_onehot.py
CoPE.forward computes the fractional positions `pos` per batch, head, query and key (b h i j), then
einx.subtract('i, j -> i j', pos, self.positions): an expression for a 1-dim `pos`, which einx
rejects (RankError); the next line's einsum expects b h i j p, i.e. '... j, p -> ... j p'.
"""
import sys

import torch
from x_transformers import Decoder, TransformerWrapper

ok = True
for opts in ({"attn_use_cope": True}, {"attn_use_cope": True, "attn_cope_soft_onehot_pos": True}):
    torch.manual_seed(0)
    model = TransformerWrapper(num_tokens=64, max_seq_len=64, attn_layers=Decoder(
        dim=256, depth=2, heads=4, attn_dim_head=64, **opts)).eval()
    try:
        with torch.no_grad():
            out = model(torch.randint(0, 64, (2, 16)))
        got = "runs" if torch.isfinite(out).all() else "non-finite output"
    except Exception as e:  # noqa: BLE001  the bug raises: its error is the actual result, printed, then BUG
        got = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    ok &= got == "runs"
    print(f"{opts}: expected runs, actual {got}")
print("OK" if ok else "BUG: CoPE's soft one-hot positions are subtracted with a 1-dim einx expression")
sys.exit(0 if ok else 1)
