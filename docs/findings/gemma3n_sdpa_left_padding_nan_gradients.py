"""Gemma3nForCausalLM with SDPA: a left-padded batch gives NaN gradients to every parameter, when
the pad token's embedding row is zero (as padding_idx initialises it) and the pads hold the pad
token id. Exit 1 while that case has NaN gradients (the bug), 0 when it has none.

transformers 5.23.0, torch (CPU); random weights from a small config, no download; seconds. Run as is:
    python docs/findings/gemma3n_sdpa_left_padding_nan_gradients.py
A left pad's hidden state is exactly zero (its embedding rows are zero, and SDPA returns zeros for a
query that sees no key); Gemma3nTextModel.forward's AltUp magnitudes
`torch.mean(h ** 2, dim=-1, keepdim=True) ** 0.5` have an infinite derivative there, and 0 * inf =
NaN flows into every parameter although the loss reads the real tokens only. Eager attention gives
a pad row uniform weights (a finite fill), so its state is not zero. A checkpoint whose pad rows are
not zero, or pads holding another id, do not show it (measured below).
"""
import sys

import torch
from transformers import Gemma3nForCausalLM, Gemma3nTextConfig


def nan_grads(impl: str, pad_rows: str, pad_id: bool) -> int:
    cfg = Gemma3nTextConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_kv_shared_layers=0,
                            vocab_size_per_layer_input=128, hidden_size_per_layer_input=16,
                            layer_types=["sliding_attention", "full_attention"], sliding_window=16,
                            attn_implementation=impl)
    torch.manual_seed(0)
    m = Gemma3nForCausalLM(cfg).eval()
    if pad_rows == "random":  # as a trained checkpoint's pad rows may be
        with torch.no_grad():
            for e in (m.model.embed_tokens, m.model.embed_tokens_per_layer):
                e.weight[cfg.pad_token_id] = torch.randn(e.weight.shape[1]) * e.weight.std()
    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :4] = 0                   # the second row: 4 left pads
    if pad_id:
        ids[1, :4] = cfg.pad_token_id
    logits = m(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    torch.nn.functional.cross_entropy(logits[real][:-1], ids[real][1:]).backward()  # real tokens only
    return sum(int((~torch.isfinite(p.grad)).sum()) for p in m.parameters() if p.grad is not None)


bug = None
for impl, rows, pad_id in (("eager", "zero", True), ("sdpa", "zero", True), ("sdpa", "random", True),
                           ("sdpa", "zero", False)):
    n = nan_grads(impl, rows, pad_id)
    what = f"{impl}, pad embedding rows {rows}, pads holding {'the pad token id' if pad_id else 'ordinary ids'}"
    if (impl, rows, pad_id) == ("sdpa", "zero", True):
        bug = n
        print(f"{what}: non-finite parameter gradients expected 0, actual {n}")
    else:
        print(f"{what}: non-finite parameter gradients {n}")
print("OK: no NaN gradients" if bug == 0 else "BUG: NaN gradients from the pads' all-zero states")
sys.exit(0 if bug == 0 else 1)
