"""x-transformers: in a model cast to bfloat16 (model.to(torch.bfloat16), or .bfloat16()), the
rotary, polar and scaled sinusoidal position embeddings compute their phases from positions and
frequencies rounded to bfloat16: past position 256 neighbouring positions share a phase, and at
4096 sixteen positions in a row are one. Exit 1 while they do, 0 once the phases are float32.

x-transformers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/xt_rotary_bfloat16_positions.py
RotaryEmbedding.forward: freqs = einsum('b i , j -> b i j', t.type_as(self.inv_freq), self.inv_freq),
with inv_freq a buffer that .to(bfloat16) casts; @disable_autocast keeps autocast out, not a cast
module. PolarEmbedding does the same, ScaledSinusoidalEmbedding multiplies by its bfloat16 inv_freq.
The same class of bug as huggingface/transformers#29496 (fixed there by computing the phases in float32).
"""
import sys

import torch
from x_transformers import Decoder, TransformerWrapper
from x_transformers.x_transformers import RotaryEmbedding

TOL = 0.05   # radians: attention sees phase differences; frequencies rounded to bfloat16 (2^-9 relative)
             # leave (15 positions) x 2^-9 ~ 0.03 rad at the highest frequency; rounded positions leave up to pi

pos = torch.arange(4096, 4112)
rot = RotaryEmbedding(16)
exact = (pos - pos[0]).double()[:, None] * rot.inv_freq.double()[None] / rot.interpolation_factor
freqs = rot.to(torch.bfloat16)(pos)[0].reshape(16, -1)[:, ::2].double()
diff = freqs - freqs[:1]   # each position's phase relative to the first: what q.k depends on
err = float(((diff - exact + torch.pi) % (2 * torch.pi) - torch.pi).abs().max())
distinct = len({tuple(r.tolist()) for r in freqs})
print(f"RotaryEmbedding cast to bfloat16, positions 4096..4111: phases relative to position 4096, error "
      f"expected <= {TOL:g} rad, actual {err:.3g} rad; {distinct} distinct phase rows for 16 positions (expected 16)")
ok = err <= TOL and distinct == 16

# the model: 16 tokens at positions 4096.. (pos= reaches the rotary embedding from x-transformers 2.11 on)
torch.manual_seed(0)
model = TransformerWrapper(num_tokens=64, max_seq_len=0, attn_layers=Decoder(
    dim=256, depth=2, heads=4, attn_dim_head=64, rotary_pos_emb=True)).eval()
x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    ref = {s: model.double()(x, pos=torch.arange(16) + s) for s in (0, 4096)}
    low = {s: model.to(torch.bfloat16)(x, pos=torch.arange(16) + s).double() for s in (0, 4096)}
e = {s: float((low[s] - ref[s]).abs().max() / ref[s].abs().max()) for s in (0, 4096)}
print(f"the model in bfloat16 against float64: at positions 0.. {e[0]:.3g}, at 4096.. {e[4096]:.3g} "
      f"(expected within 2x of the first)")
ok &= e[4096] <= 2 * e[0] + 0.005
print("OK" if ok else "BUG: rotary phases computed from bfloat16 positions and frequencies")
sys.exit(0 if ok else 1)
