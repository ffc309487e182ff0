"""BltForCausalLM: left padding changes the real bytes' logits, and eager and SDPA disagree on
them; right padding agrees. Exit 1 while left padding moves them (the bug), 0 when it does not.

transformers 5.23.0, torch (CPU, float32); random weights from a small config, no download; seconds. Run as is:
    python docs/findings/blt_left_padding.py
BltModel.forward (modeling_blt.py, and modular_blt.py it is generated from) builds the global
transformer's mask with create_causal_mask(..., attention_mask=None): the patches made of pad bytes
are attended by every later patch. With left padding they come first, so every real patch sees them;
the pads' states also differ between eager (a row with no visible key gets uniform weights) and SDPA
(zeros), so the two paths disagree. (`use_cache=False` throughout: with use_cache=True BltModel
builds DynamicCache(config=BltConfig) and raises, huggingface/transformers#47916.)
"""
import sys

import torch
from transformers import BltConfig, BltForCausalLM

TOL = 1e-5  # float32: pads masked out contribute exactly 0
torch.manual_seed(0)
sub = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
           intermediate_size=128, vocab_size=128)
cfg = BltConfig(vocab_size=128, encoder_hash_byte_group_vocab=128,
                patcher_config=dict(sub), global_config=dict(sub),
                encoder_config=dict(sub, hidden_size_global=64, num_hidden_layers=1),
                decoder_config=dict(sub, hidden_size_global=64))
m = BltForCausalLM(cfg).eval()
x = torch.randint(3, 128, (1, 11), generator=torch.Generator().manual_seed(1))  # 11 real bytes
pads, ones = torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 11, dtype=torch.long)
rel = lambda a, b: ((a - b).abs().max() / b.abs().max()).item()  # noqa: E731
out, worst = {}, 0.0
with torch.no_grad():
    for impl in ("eager", "sdpa"):
        m.set_attn_implementation(impl)
        alone = m(input_ids=x, use_cache=False).logits
        out[impl, "left"] = m(input_ids=torch.cat([pads, x], 1), attention_mask=torch.cat([pads, ones], 1),
                              use_cache=False).logits[:, 5:]
        out[impl, "right"] = m(input_ids=torch.cat([x, pads], 1), attention_mask=torch.cat([ones, pads], 1),
                               use_cache=False).logits[:, :11]
        for side in ("left", "right"):
            d = rel(out[impl, side], alone)
            worst = max(worst, d)
            print(f"{impl}: {side}-padded (5 pads) against unpadded, real bytes: expected <= {TOL:g}, actual {d:.3g}")
    for side in ("left", "right"):
        print(f"eager against sdpa, {side}-padded, real bytes: {rel(out['sdpa', side], out['eager', side]):.3g}")
ok = worst <= TOL
print("OK: padding does not reach the real bytes" if ok else "BUG: left pads reach the real bytes (global transformer)")
sys.exit(0 if ok else 1)
