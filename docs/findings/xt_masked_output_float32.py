"""x-transformers: a model cast to float16 or bfloat16 (model.half(), model.to(torch.bfloat16)) raises
as soon as a padding mask is passed: `RuntimeError: mat1 and mat2 must have the same dtype, but got
Float and Half`. Without a mask it runs. Exit 1 while a masked call raises or changes the dtype, 0 once
the masked model runs in its own dtype.

x-transformers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/xt_masked_output_float32.py
Attention.forward zeroes the padded positions of its output with
einx.where('b n, b n d, -> b n d', mask, out, 0.). einx 0.4 (x-transformers asks for einx>=0.3.0)
turns the Python 0. into a float32 tensor of shape (1, 1, 1), and torch.where promotes the float16 /
bfloat16 output to float32; the residual stream becomes float32 and the next layer's Linear, in the
model's dtype, refuses it. With einx 0.3.0 the result keeps the model's dtype.
"""
import sys

import torch
from x_transformers import ContinuousTransformerWrapper, Decoder, TransformerWrapper
from x_transformers.x_transformers import Attention

TOL = 0.05   # the low-precision model against its float32 self on the kept positions (bfloat16: 8 bits)

einx = sys.modules["einx"]   # imported by x-transformers; __version__ from 0.4 on
print(f"einx {getattr(einx, '__version__', 'before 0.4 (no __version__)')} ({einx.__file__})")

x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
xc = torch.randn(2, 16, 8, generator=torch.Generator().manual_seed(1))
mask = torch.ones(2, 16, dtype=torch.bool)
mask[1, :5] = False   # the second sequence left-padded by 5


def build(kind):
    torch.manual_seed(0)
    layers = Decoder(dim=256, depth=2, heads=4, attn_dim_head=64)
    if kind == "TransformerWrapper":
        return TransformerWrapper(num_tokens=64, max_seq_len=64, attn_layers=layers).eval()
    return ContinuousTransformerWrapper(dim_in=8, dim_out=8, max_seq_len=64, attn_layers=layers).eval()


ok = True
# the cause, on one Attention module: the dtype of its masked output
torch.manual_seed(0)
attn = Attention(dim=256, heads=4, dim_head=64).half().eval()
with torch.no_grad():
    got = attn(torch.randn(2, 16, 256).half(), mask=mask).dtype
print(f"Attention cast to float16, mask=: output dtype expected torch.float16, actual {got}")
ok &= got == torch.float16

for kind in ("TransformerWrapper", "ContinuousTransformerWrapper"):
    inp = x if kind == "TransformerWrapper" else xc
    with torch.no_grad():
        ref = build(kind)(inp, mask=mask)   # float32, masked
    keep = mask[..., None]
    for dtype in (torch.float16, torch.bfloat16):
        model = build(kind).to(dtype)
        low_inp = inp if kind == "TransformerWrapper" else inp.to(dtype)
        for masked in (False, True):
            try:
                with torch.no_grad():
                    out = model(low_inp, mask=mask if masked else None)
                got = f"runs, {out.dtype}"
                good = out.dtype == dtype
                if masked:   # against float32 on the positions the mask keeps
                    err = float(((out.float() - ref) * keep).abs().max() / (ref * keep).abs().max())
                    got += f", {err:.3g} from float32"
                    good &= err <= TOL
            except RuntimeError as e:
                got, good = f"{type(e).__name__}: {str(e).splitlines()[0]}", False
            ok &= good
            print(f"{kind} cast to {dtype}, {'mask=' if masked else 'no mask'}: expected runs, {dtype}"
                  f"{f', <= {TOL:g} from float32' if masked else ''}; actual {got}")
print("OK" if ok else "BUG: a float16 / bfloat16 model raises (or turns float32) when given a mask")
sys.exit(0 if ok else 1)
