"""xLSTMForCausalLM: with the default qk_dim_factor (0.5), any forward with use_cache=True raises.

transformers 5.23.0, torch (CPU, the native kernels); random weights from a small config, no
download. Run as is:
    python docs/findings/xlstm_use_cache_qk_dim.py
The mLSTM cell's C state is (head dim of q/k) x (head dim of v); the state the cached path hands to
the native recurrent step is (v head) x (v head), which the step rejects ("matC_old has wrong
shape") whenever the q/k head is narrower than the v head, as the default config makes it
(qk_dim_factor 0.5, v_dim_factor 1.0).
With qk_dim_factor 1.0 the same calls run and the cached step matches the full forward.
"""
import torch
from transformers import xLSTMConfig, xLSTMForCausalLM

x = torch.randint(0, 128, (2, 12))
for qk in (0.5, 1.0):
    torch.manual_seed(0)
    cfg = xLSTMConfig(vocab_size=128, hidden_size=64, embedding_dim=64, num_blocks=2,
                      num_hidden_layers=2, qk_dim_factor=qk)
    m = xLSTMForCausalLM(cfg).eval()
    with torch.no_grad():
        full = m(input_ids=x, use_cache=False).logits
        try:
            pre = m(input_ids=x[:, :11], use_cache=True)
            step = m(input_ids=x[:, 11:], cache_params=pre.cache_params, use_cache=True).logits
            err = (step[:, -1] - full[:, -1]).abs().max() / full.abs().max()
            print(f"qk_dim_factor {qk}: prefill 11 + 1 cached step ran; against the full forward {err.item():.3g}")
        except ValueError as e:
            print(f"qk_dim_factor {qk}: use_cache=True raised ValueError: {e}")
