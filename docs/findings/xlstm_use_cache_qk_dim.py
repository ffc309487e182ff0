"""xLSTMForCausalLM: use_cache=True raises whenever hidden_size * qk_dim_factor is not a multiple of
64 (hidden_size 64 with the default qk_dim_factor 0.5). Exit 1 while it raises (the bug), 0 when the
prefill and a cached step run and match the full forward.

transformers 5.23.0 and 5.25.0, torch (CPU, the native kernels); random weights from small configs, no
download; seconds. Run as is:
    python docs/findings/xlstm_use_cache_qk_dim.py
xLSTMLayer sizes q and k as int(hidden_size * qk_dim_factor); xLSTMCache.__init__ sizes the C and n
states with config.qk_head_dim, whose qk_dim rounds up to a multiple of 64 (configuration_xlstm.py).
They differ unless hidden_size * qk_dim_factor is a multiple of 64 (true of xLSTM-7b's 4096 * 0.5),
and the native step rejects the cached state ("matC_old has wrong shape").
"""
import sys

import torch
from transformers import xLSTMConfig, xLSTMForCausalLM

TOL = 1e-5  # a cached step against the full forward: the same recurrence in another order
x = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
ok = True
for hidden, qk in ((64, 0.5), (128, 0.5), (64, 1.0)):
    torch.manual_seed(0)
    cfg = xLSTMConfig(vocab_size=128, hidden_size=hidden, embedding_dim=hidden, num_blocks=2,
                      num_hidden_layers=2, qk_dim_factor=qk)
    m = xLSTMForCausalLM(cfg).eval()
    what = f"hidden_size {hidden}, qk_dim_factor {qk} (q/k width {int(hidden * qk)})"
    with torch.no_grad():
        full = m(input_ids=x, use_cache=False).logits
        try:
            pre = m(input_ids=x[:, :11], use_cache=True)
            step = m(input_ids=x[:, 11:], cache_params=pre.cache_params, use_cache=True).logits
            err = ((step[:, -1] - full[:, -1]).abs().max() / full.abs().max()).item()
            ok &= err <= TOL
            print(f"{what}: prefill 11 + 1 cached step against the full forward: expected <= {TOL:g}, actual {err:.3g}")
        except ValueError as e:
            ok = False
            print(f"{what}: prefill 11 + 1 cached step: expected to run, actual ValueError: {str(e)[:90]}")
print("OK: the cache fits the layers" if ok else "BUG: use_cache=True raises (the cache's q/k width is not the layers')")
sys.exit(0 if ok else 1)
