"""x-transformers: memory tokens (num_memory_tokens) break padded batches. Interspersed every m
tokens (memory_tokens_interspersed_every), any padding mask raises; prepended, left padding given as
seq_start_pos= (x-transformers' own argument for it) hides the memory tokens instead of the pads.
Exit 1 while either happens, 0 once a padded row's real tokens get the unpadded row's outputs.

x-transformers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/xt_memory_tokens_padding.py
TransformerWrapper.forward pads the mask for prepended memory tokens only when they are not
interspersed ("auto-handle masking ... if not exists(mem_every)"), so the interspersed layout's
attention sees a (b, n) mask beside (b, n + memory) keys. seq_start_pos goes on to AttentionLayers,
which masks the first seq_start_pos positions of the sequence it gets: the memory tokens now stand
there, and the pads after them stay visible.
"""
import sys

import torch
from x_transformers import Decoder, TransformerWrapper

TOL = 1e-5


def build(**wrapper):
    torch.manual_seed(0)
    return TransformerWrapper(num_tokens=64, max_seq_len=64, **wrapper, attn_layers=Decoder(
        dim=256, depth=2, heads=4, attn_dim_head=64)).eval()   # absolute positions: seq_start_pos shifts them


real = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(1))
P = 4   # left pads
padded = torch.cat([torch.zeros(1, P, dtype=torch.long), real], 1)
mask = torch.ones(1, 16, dtype=torch.bool)
mask[0, :P] = False
ok = True
for wrapper in ({}, {"num_memory_tokens": 2}):   # left padding as seq_start_pos: the unpadded row's outputs
    model = build(**wrapper)
    with torch.no_grad():
        ref = model(real)
        got = model(padded, seq_start_pos=torch.tensor([P]))[:, P:]
    err = float((got - ref).abs().max() / ref.abs().max())
    ok &= err <= TOL
    print(f"{wrapper or 'no memory tokens'}, left padding as seq_start_pos: real tokens against the unpadded "
          f"row: expected <= {TOL:g}, actual {err:.3g}")
# interspersed memory tokens regroup the tokens by position, so padding moves them between groups:
# what is expected is that a padding mask is taken at all
model = build(num_memory_tokens=2, memory_tokens_interspersed_every=4)
try:
    with torch.no_grad():
        out = model(padded, mask=mask)
    actual = "runs" if torch.isfinite(out).all() else "non-finite output"
except Exception as e:  # noqa: BLE001  the bug raises: its error is the actual result, printed, then BUG
    actual = f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"
ok &= actual == "runs"
print(f"interspersed every 4, a padding mask: expected runs, actual {actual}")
print("OK" if ok else "BUG: memory tokens break left-padded batches")
sys.exit(0 if ok else 1)
