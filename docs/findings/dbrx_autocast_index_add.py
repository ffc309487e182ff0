"""DbrxForCausalLM raises under float16/bfloat16 autocast: its experts add half-precision outputs
into a float32 buffer with index_add_, which autocast does not promote. Exit 1 while it raises (the
bug), 0 when both autocast forwards run and give finite logits.

transformers 5.23.0 and 5.25.0, torch (CPU); random weights from a small config, no download; seconds. Run as is:
    python docs/findings/dbrx_autocast_index_add.py
DbrxExperts.forward (modeling_dbrx.py, and modular_dbrx.py it is generated from): `next_states` is
zeros_like(hidden_states), float32 under autocast (it comes from a LayerNorm), while each expert's
output is half precision (its matmuls autocast). Mixtral's experts cast before index_add_.
The config sets the two attention values DBRX's checkpoints carry and its default config lacks
(attn_config.rope_theta, clip_qkv; the default builds no runnable model).
"""
import sys

import torch
from transformers import DbrxConfig, DbrxForCausalLM

torch.manual_seed(0)
cfg = DbrxConfig(d_model=256, n_heads=2, n_layers=2, vocab_size=128, max_seq_len=64,   # head size 128, DBRX's
                 attn_config=dict(kv_n_heads=1, clip_qkv=8.0),
                 ffn_config=dict(ffn_hidden_size=128, moe_num_experts=4, moe_top_k=2))
cfg.attn_config.rope_theta = 500000.0
m = DbrxForCausalLM(cfg).eval()
x = torch.randint(3, 128, (2, 8), generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    ref = m(input_ids=x).logits
ok = True
for dtype in (torch.bfloat16, torch.float16):
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
            y = m(input_ids=x).logits.float()
        ok &= bool(torch.isfinite(y).all())
        print(f"{str(dtype)[6:]} autocast: expected a forward with finite logits, actual: ran, finite "
              f"{bool(torch.isfinite(y).all())}, {((y - ref).abs().max() / ref.abs().max()).item():.3g} from float32's")
    except RuntimeError as e:
        ok = False
        print(f"{str(dtype)[6:]} autocast: expected a forward with finite logits, actual: RuntimeError: {str(e).splitlines()[0]}")
print("OK: DBRX runs under autocast" if ok else "BUG: DBRX cannot run under autocast")
sys.exit(0 if ok else 1)
