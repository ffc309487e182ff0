"""BambaForCausalLM: a forward through the cache without position_ids puts the new tokens at
position 0. Exit 1 while it does (the bug), 0 when the cached step matches the full forward.

transformers 5.23.0 and 5.25.0, torch (CPU); random weights from small configs, no download; seconds. Run as is:
    python docs/findings/bamba_cached_step_positions.py
BambaModel.forward fills absent position_ids with torch.arange(seq_len), not offset by the cache's
length (Llama, Falcon-H1, Nemotron-H and GraniteMoeHybrid add past_key_values.get_seq_length()),
so the rotary phases of a cached step are those of position 0. generate() passes position_ids and
is not affected; a decoding loop of one's own, model(input_ids=new, past_key_values=cache), is.
"""
import sys

import torch
from transformers import BambaConfig, BambaForCausalLM, LlamaConfig, LlamaForCausalLM

TOL = 1e-5  # float32: a cached step and the full forward sum the same terms in another order
small = dict(vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=1)   # Bamba-9B's head size: 128 (4096 / 32 heads)


def cached_step_error(m, x, **kw) -> float:
    """Prefill all but the last token, then the last one through the cache: its logits against the
    full forward's, relative to their largest magnitude."""
    with torch.no_grad():
        full = m(input_ids=x, use_cache=False).logits[:, -1]
        cache = m(input_ids=x[:, :-1], use_cache=True).past_key_values
        step = m(input_ids=x[:, -1:], past_key_values=cache, use_cache=True, **kw).logits[:, -1]
    return ((step - full).abs().max() / full.abs().max()).item()


torch.manual_seed(0)
x = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
llama = LlamaForCausalLM(LlamaConfig(**small)).eval()
print(f"llama (reference), no position_ids: cached step against the full forward {cached_step_error(llama, x):.3g}")
ok = True
for what, cfg in (("bamba, two attention layers", BambaConfig(**small, attn_layer_indices=[0, 1])),
                  ("bamba, Mamba2 then attention", BambaConfig(**small, attn_layer_indices=[1], mamba_chunk_size=16))):
    m = BambaForCausalLM(cfg).eval()
    given = cached_step_error(m, x, position_ids=torch.full((2, 1), 11))
    absent = cached_step_error(m, x)
    ok &= absent <= TOL
    print(f"{what}: cached step against the full forward: with position_ids=11 {given:.3g}; "
          f"without position_ids expected <= {TOL:g}, actual {absent:.3g}")
print("OK: a cached step without position_ids continues from the cache" if ok else
      "BUG: a cached step without position_ids runs at position 0")
sys.exit(0 if ok else 1)
