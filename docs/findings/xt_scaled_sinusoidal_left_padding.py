"""x-transformers: scaled sinusoidal positions (TransformerWrapper(scaled_sinu_pos_emb=True)) raise
on a left-padded batch given as seq_start_pos= (x-transformers' own argument for left padding).
Exit 1 while they do, 0 once a padded row's real tokens get the unpadded row's outputs.

x-transformers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/xt_scaled_sinusoidal_left_padding.py
ScaledSinusoidalEmbedding.forward subtracts seq_start_pos per row (pos becomes (b, n)) and then
computes einsum('i, j -> i j', pos, inv_freq), an equation for one row of positions;
AbsolutePositionalEmbedding, beside it, takes (b, n) positions.
"""
import sys

import torch
from x_transformers import Decoder, TransformerWrapper

TOL = 1e-5
real = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
P = 4
padded = torch.cat([torch.zeros(2, P, dtype=torch.long), real], 1)
ok = True
for wrapper in ({}, {"scaled_sinu_pos_emb": True}):
    torch.manual_seed(0)
    model = TransformerWrapper(num_tokens=64, max_seq_len=64, **wrapper, attn_layers=Decoder(
        dim=256, depth=2, heads=4, attn_dim_head=64)).eval()
    try:
        with torch.no_grad():
            ref = model(real)
            got = model(padded, seq_start_pos=torch.tensor([P, P]))[:, P:]
        err = float((got - ref).abs().max() / ref.abs().max())
        actual, good = f"{err:.3g}", err <= TOL
    except Exception as e:  # noqa: BLE001  an error is the actual result, printed, and not good: BUG
        actual, good = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}", False
    ok &= good
    print(f"{wrapper or 'absolute positions'}, left padding as seq_start_pos: real tokens against the unpadded "
          f"rows: expected <= {TOL:g}, actual {actual}")
print("OK" if ok else "BUG: scaled sinusoidal positions take one row of positions only")
sys.exit(0 if ok else 1)
