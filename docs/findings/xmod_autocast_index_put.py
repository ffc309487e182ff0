"""XmodForCausalLM raises under float16/bfloat16 autocast: its language adapters write
half-precision outputs into a float32 tensor by boolean index, which autocast does not promote.
Exit 1 while it raises (the bug), 0 when both autocast forwards run and give finite logits.

transformers 5.23.0 and 5.25.0, torch (CPU); random weights from a small config, no download; seconds. Run as is:
    python docs/findings/xmod_autocast_index_put.py
XmodOutput.lang_adapter (modeling_xmod.py): `new_hidden_states` is zeros_like(hidden_states),
float32 under autocast (it comes from a LayerNorm and a residual sum), while each adapter's output
is half precision (its Linear layers autocast); `new_hidden_states[lang_mask] = ...` then raises.
"""
import sys

import torch
from transformers import XmodConfig, XmodForCausalLM

torch.manual_seed(0)
cfg = XmodConfig(vocab_size=128, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,   # head size 64, X-MOD's
                 intermediate_size=256, is_decoder=True, default_language="en_XX")
m = XmodForCausalLM(cfg).eval()
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
print("OK: X-MOD runs under autocast" if ok else "BUG: X-MOD cannot run under autocast")
sys.exit(0 if ok else 1)
