"""diffusers: Sana's linear attention (SanaLinearAttnProcessor2_0, and the PAG variants built on it)
returns NaN under float16 autocast, on any input: it upcasts q, k, v to float32 for its sums, but
autocast runs the matmuls that follow in float16 again, and the normaliser's epsilon (1e-15)
underflows to 0 in float16, so a query whose ReLU features are all zero divides 0 by 0. With the
weights cast to float16 (no autocast) the upcast holds and the output is finite. Exit 1 while
autocast gives non-finite outputs, 0 once it matches the float32 module.

diffusers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/diffusers_sana_linear_autocast.py
SanaLinearAttnProcessor2_0.__call__: `query, key, value = query.float(), key.float(), value.float()`,
then `scores = torch.matmul(value, key)`, `hidden_states = torch.matmul(scores, query)` (float16 under
autocast) and `hidden_states[:, :, :-1] / (hidden_states[:, :, -1:] + 1e-15)`.
"""
import sys

import torch
from diffusers.models.attention_processor import Attention, PAGCFGSanaLinearAttnProcessor2_0, SanaLinearAttnProcessor2_0

ok = True
for cls, copies in ((SanaLinearAttnProcessor2_0, 1), (PAGCFGSanaLinearAttnProcessor2_0, 3)):
    torch.manual_seed(0)
    attn = Attention(32, heads=4, dim_head=8, kv_heads=4, processor=cls()).eval()
    x = torch.randn(2, 64, 32).repeat(copies, 1, 1)   # PAG with CFG: uncond, cond, perturbed copies
    with torch.no_grad():
        ref = attn(x)[:2]
        with torch.autocast("cpu", dtype=torch.float16):
            amp = attn(x)[:2].float()
        half = attn.half()(x.half())[:2].float()
    for what, y in (("float16 weights", half), ("float16 autocast", amp)):
        bad = int((~torch.isfinite(y)).sum())
        err = float((y - ref).abs().nan_to_num(float("inf")).max() / ref.abs().max())
        ok &= bad == 0 and err <= 5e-3
        print(f"{cls.__name__}, {what}: expected finite and within 5e-3 of float32, actual {bad} non-finite of "
              f"{y.numel()}, error {err:.3g}")
print("OK" if ok else "BUG: under autocast, Sana's linear attention sums in float16 and divides 0 by 0")
sys.exit(0 if ok else 1)
