"""CpmAntForCausalLM trained with labels: each position attends to the tokens after it, so the
token it is labelled with is in its input. Exit 1 while the labelled logits see later tokens (the
bug), 0 when they are causal.

transformers 5.23.0, torch (CPU); random weights from a small config, no download; seconds. Run as is:
    python docs/findings/cpmant_causal_lm_sees_the_future.py
CpmAntModel.forward (modeling_cpmant.py) sets `context` to all ones, and _prepare_attention_mask lets
every context token attend to every other one: the whole input is a bidirectional prompt, CPM-Live's
convention at inference (OpenBMB/CPM-Live#259: "when inferencing, context is all set to True"),
where only the last position's logits are used. CPM-Live trains with context 0 on the target part,
attended causally; CpmAntForCausalLM(input_ids, labels=...) keeps the inference convention, and its
loss (on labels not shifted: the user passes the next tokens) is computed on logits that saw them.
"""
import sys

import torch
from transformers import CpmAntConfig, CpmAntForCausalLM

torch.manual_seed(0)
m = CpmAntForCausalLM(CpmAntConfig(vocab_size=128, hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                                   dim_head=16, dim_ff=128)).eval()
g = torch.Generator().manual_seed(1)
x = torch.randint(3, 128, (1, 13), generator=g)
inputs, labels = x[:, :-1], x[:, 1:]              # labels: the next tokens (its loss does not shift them)
later = inputs.clone()
later[:, 6:] = torch.randint(3, 128, (1, 6), generator=g)  # the same first 6 tokens, the last 6 changed
with torch.no_grad():
    a, b = m(input_ids=inputs).logits[:, :6], m(input_ids=later).logits[:, :6]
    print(f"no labels (generation: a bidirectional prompt, by design): logits at 0..5 when tokens 6..11 change: "
          f"{(a - b).abs().max().item():.3g} (their scale {a.abs().max().item():.3g})")
    out_a, out_b = m(input_ids=inputs, labels=labels), m(input_ids=later, labels=labels)
    leak = (out_a.logits[:, :6] - out_b.logits[:, :6]).abs().max().item()
    print(f"with labels (training): logits at 0..5 when tokens 6..11 change: expected 0, actual {leak:.3g}; "
          f"the loss {out_a.loss.item():.4f} -> {out_b.loss.item():.4f}")
ok = leak == 0
print("OK: a labelled position sees only the tokens before it" if ok else
      "BUG: a labelled position attends to the tokens after it (its label among them)")
sys.exit(0 if ok else 1)
