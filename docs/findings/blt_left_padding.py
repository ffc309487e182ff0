"""BltForCausalLM: left padding changes the real tokens' logits, and eager and SDPA attention
disagree on them; right padding and unpadded batches agree to 1e-6.

transformers 5.23.0, torch (CPU, float32); random weights from a small config, no download. Run as is:
    python docs/findings/blt_left_padding.py
(`use_cache=False` throughout: with the default use_cache=True, BltModel.forward builds
DynamicCache(config=BltConfig), which has no num_hidden_layers and raises AttributeError; that part
is huggingface/transformers#47916.)
"""
import torch
from transformers import BltConfig, BltForCausalLM

torch.manual_seed(0)
sub = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
           intermediate_size=128, vocab_size=128)
cfg = BltConfig(vocab_size=128, encoder_hash_byte_group_vocab=128,
                patcher_config=dict(sub), global_config=dict(sub),
                encoder_config=dict(sub, hidden_size_global=64, num_hidden_layers=1),
                decoder_config=dict(sub, hidden_size_global=64))
m = BltForCausalLM(cfg).eval()
g = torch.Generator().manual_seed(1)
x = torch.randint(3, 128, (1, 11), generator=g)                      # 11 real bytes
left = torch.cat([torch.zeros(1, 5, dtype=torch.long), x], 1)        # 5 pads on the left
lmask = torch.cat([torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 11, dtype=torch.long)], 1)
right = torch.cat([x, torch.zeros(1, 5, dtype=torch.long)], 1)
rmask = lmask.flip(1)
with torch.no_grad():
    out = {}
    for impl in ("eager", "sdpa"):
        m.set_attn_implementation(impl)
        alone = m(input_ids=x, use_cache=False).logits
        out[impl, "left"] = m(input_ids=left, attention_mask=lmask, use_cache=False).logits[:, 5:]
        out[impl, "right"] = m(input_ids=right, attention_mask=rmask, use_cache=False).logits[:, :11]
        for side in ("left", "right"):
            d = (out[impl, side] - alone).abs().max() / alone.abs().max()
            print(f"{impl}: {side}-padded against unpadded, real tokens: {d.item():.3g}")
    for side in ("left", "right"):
        d = (out["eager", side] - out["sdpa", side]).abs().max() / out["eager", side].abs().max()
        print(f"eager against sdpa, {side}-padded, real tokens: {d.item():.3g}")
