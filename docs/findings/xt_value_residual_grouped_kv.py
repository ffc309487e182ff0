"""x-transformers: value residual learning (add_value_residual=True, its learned mix on by default)
with grouped-query attention (attn_kv_heads < heads) raises on every forward. Exit 1 while it does,
0 when the model runs and its output is finite.

x-transformers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/xt_value_residual_grouped_kv.py
Attention.__init__ makes the learned mix per query head (nn.Linear(dim, heads)), but the values it
mixes are per key/value head: value_residual.lerp(v, mix) broadcasts (b, kv_heads, n, d) against
(b, heads, n, 1) and fails whenever kv_heads < heads.
"""
import sys

import torch
from x_transformers import Decoder, TransformerWrapper


def run(**opts) -> str:
    torch.manual_seed(0)
    model = TransformerWrapper(num_tokens=64, max_seq_len=64, attn_layers=Decoder(
        dim=256, depth=2, heads=4, attn_dim_head=64, **opts)).eval()
    try:
        with torch.no_grad():
            out = model(torch.randint(0, 64, (2, 16)))
        return "ok" if torch.isfinite(out).all() else "non-finite output"
    except RuntimeError as e:
        return f"RuntimeError: {str(e).splitlines()[0]}"


ok = True
for opts, expected in (({"add_value_residual": True}, "ok"),
                       ({"attn_kv_heads": 2}, "ok"),
                       ({"add_value_residual": True, "learned_value_residual_mix": False, "attn_kv_heads": 2}, "ok"),
                       ({"add_value_residual": True, "attn_kv_heads": 2}, "ok"),
                       ({"add_value_residual": True, "attn_one_kv_head": True}, "ok")):
    got = run(**opts)
    ok &= got == expected
    print(f"{opts}: expected {expected}, actual {got}")
print("OK: value residual learning works with grouped key/value heads" if ok else
      "BUG: value residual learning's learned mix has one gate per query head, the values one per kv head")
sys.exit(0 if ok else 1)
