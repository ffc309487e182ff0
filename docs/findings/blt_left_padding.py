"""BltForCausalLM: left padding changes the real bytes' logits, and eager and SDPA disagree on
them; right padding agrees. Exit 1 while left padding moves them (the bug), 0 when it does not.

transformers 5.23.0 and 5.25.0, torch (CPU, float32); random weights from a small config, no download; seconds. Run as is:
    python docs/findings/blt_left_padding.py
Two routes in BltModel.forward (modeling_blt.py, and modular_blt.py it is generated from), one
problem: left pads reach the real bytes. (1) The global transformer's mask is built with
create_causal_mask(..., attention_mask=None): the patches made of pad bytes are attended by every
later patch, and the pads' states differ between eager (a row with no visible key gets uniform
weights) and SDPA (zeros), so the two paths disagree. (2) compute_hash_embeddings hashes each byte
with the up to 8 bytes before it, ignoring the mask: the first real bytes' n-gram embeddings read
the pads (pads holding byte 0 happen to match the zeros the hash puts before a sequence's start).
(`use_cache=False` throughout: with use_cache=True BltModel builds DynamicCache(config=BltConfig)
and raises, huggingface/transformers#47916.)
"""
import sys

import torch
from transformers import BltConfig, BltForCausalLM

TOL = 1e-5  # float32: pads masked out contribute exactly 0
torch.manual_seed(0)
# BLT-1B's head sizes: 64 in the local encoder, decoder and entropy model, 128 in the global transformer
sub = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=2,
           intermediate_size=256, vocab_size=128)
cfg = BltConfig(vocab_size=128, encoder_hash_byte_group_vocab=128,
                patcher_config=dict(sub), global_config=dict(sub, hidden_size=256, intermediate_size=512),
                encoder_config=dict(sub, hidden_size_global=256, num_hidden_layers=1),
                decoder_config=dict(sub, hidden_size_global=256))
m = BltForCausalLM(cfg).eval()
g = torch.Generator().manual_seed(1)
x = torch.randint(3, 128, (1, 11), generator=g)  # 11 real bytes
zeros, ones = torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 11, dtype=torch.long)
pad_ids = {"byte 0": zeros, "ordinary bytes": torch.randint(3, 128, (1, 5), generator=g)}
rel = lambda a, b: ((a - b).abs().max() / b.abs().max()).item()  # noqa: E731
out, worst = {}, 0.0
with torch.no_grad():
    for impl in ("eager", "sdpa"):
        m.set_attn_implementation(impl)
        alone = m(input_ids=x, use_cache=False).logits
        for held, pads in pad_ids.items():
            out[impl, "left", held] = m(input_ids=torch.cat([pads, x], 1), attention_mask=torch.cat([zeros, ones], 1),
                                        use_cache=False).logits[:, 5:]
            out[impl, "right", held] = m(input_ids=torch.cat([x, pads], 1), attention_mask=torch.cat([ones, zeros], 1),
                                         use_cache=False).logits[:, :11]
            for side in ("left", "right"):
                d = rel(out[impl, side, held], alone)
                worst = max(worst, d)
                print(f"{impl}: {side}-padded (5 pads holding {held}) against unpadded, real bytes: "
                      f"expected <= {TOL:g}, actual {d:.3g}")
    for side in ("left", "right"):
        print(f"eager against sdpa, {side}-padded (pads holding byte 0), real bytes: "
              f"{rel(out['sdpa', side, 'byte 0'], out['eager', side, 'byte 0']):.3g}")
ok = worst <= TOL
print("OK: padding does not reach the real bytes" if ok else "BUG: left pads reach the real bytes (the global transformer, the n-gram hashes)")
sys.exit(0 if ok else 1)
