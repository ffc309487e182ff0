"""Gemma3nForCausalLM with SDPA: one left-padded batch gives NaN gradients to every parameter.

transformers 5.23.0, torch (CPU); random weights from a small config, no download. Run as is:
    python docs/findings/gemma3n_sdpa_left_padding_nan_gradients.py
The pad token's embedding is zero (padding_idx), and SDPA returns zeros for a query that sees no
key (a left pad), so a pad position's hidden state is exactly zero; AltUp's magnitude
`torch.mean(h ** 2, dim=-1, keepdim=True) ** 0.5` (modeling_gemma3n.py) has an infinite derivative
there, and 0 * inf = NaN flows into the parameters although the loss reads the real tokens only.
Eager attention gives a pad row uniform weights (a finite fill), so its state is not zero.
"""
import torch
from transformers import Gemma3nForCausalLM, Gemma3nTextConfig

for impl in ("eager", "sdpa"):
    cfg = Gemma3nTextConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_kv_shared_layers=0,
                            vocab_size_per_layer_input=128, hidden_size_per_layer_input=16,
                            layer_types=["sliding_attention", "full_attention"], sliding_window=16,
                            attn_implementation=impl)
    torch.manual_seed(0)
    m = Gemma3nForCausalLM(cfg).eval()
    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :4] = 0                   # the second row: 4 left pads, holding the pad token
    ids[1, :4] = cfg.pad_token_id
    logits = m(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    torch.nn.functional.cross_entropy(logits[real][:-1], ids[real][1:]).backward()  # real tokens only
    bad = sum((~torch.isfinite(p.grad)).sum().item() for p in m.parameters() if p.grad is not None)
    print(f"{impl}: real tokens' logits finite: {torch.isfinite(logits[real]).all().item()}; "
          f"non-finite parameter gradients: {bad}")
