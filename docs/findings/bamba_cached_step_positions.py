"""BambaForCausalLM: a forward through the cache without position_ids puts the new tokens at
position 0.

transformers 5.23.0, torch (CPU); random weights from a small config, no download. Run as is:
    python docs/findings/bamba_cached_step_positions.py
BambaModel.forward fills absent position_ids with torch.arange(seq_len), ignoring the cached
length (Llama, Falcon-H1 and the other causal LMs add the cache's length), so the rotary phases of a
cached step are those of position 0. generate() passes position_ids and is not affected; a
decoding loop of one's own, calling model(input_ids=new, past_key_values=cache), is.
"""
import torch
from transformers import BambaConfig, BambaForCausalLM, LlamaConfig, LlamaForCausalLM

small = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)
torch.manual_seed(0)
models = {
    "bamba": BambaForCausalLM(BambaConfig(**small, attn_layer_indices=[0, 1])),  # attention only: no Mamba involved
    "llama (reference)": LlamaForCausalLM(LlamaConfig(**small)),
}
x = torch.randint(0, 128, (2, 12))
with torch.no_grad():
    for name, m in models.items():
        m.eval()
        full = m(input_ids=x, use_cache=False).logits[:, -1]
        for kw in ({}, {"position_ids": torch.full((2, 1), 11)}):
            cache = m(input_ids=x[:, :11], use_cache=True).past_key_values
            step = m(input_ids=x[:, 11:], past_key_values=cache, use_cache=True, **kw).logits[:, -1]
            err = (step - full).abs().max() / full.abs().max()
            how = "with position_ids=11" if kw else "without position_ids"
            print(f"{name}: prefill 11, then token 12 through the cache {how}: against the full forward {err.item():.3g}")
