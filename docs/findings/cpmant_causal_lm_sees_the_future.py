"""CpmAntForCausalLM: every position attends to the tokens after it, so a position trained (with
labels) or scored to predict the next token sees that token. Exit 1 while an earlier position's
logits change when later tokens do (with labels or without), 0 when the forward is causal.

transformers, torch (CPU); random weights from a small config, no download; seconds. Run as is:
    python docs/findings/cpmant_causal_lm_sees_the_future.py
CpmAntModel.forward (modeling_cpmant.py) sets `context` to all ones, and _prepare_attention_mask lets
every context token attend to every other one: the whole input is a bidirectional prompt, CPM-Live's
convention at inference (OpenBMB/CPM-Live#259: "when inferencing, context is all set to True").
CPM-Live trains with context 0 on the target part, attended causally; CpmAntForCausalLM offers no
way to say so, with labels or without (its loss, on labels not shifted, reads logits that saw them).
Whether labels are passed must not change the attention: checked below too.
"""
import sys

import torch
from transformers import CpmAntConfig, CpmAntForCausalLM

torch.manual_seed(0)   # CPM-Ant 10B's head size: dim_head 128 (hidden 4096, 32 heads)
m = CpmAntForCausalLM(CpmAntConfig(vocab_size=128, hidden_size=256, num_attention_heads=2, num_hidden_layers=2,
                                   dim_head=128, dim_ff=512)).eval()
g = torch.Generator().manual_seed(1)
x = torch.randint(3, 128, (1, 13), generator=g)
inputs, labels = x[:, :-1], x[:, 1:]              # labels: the next tokens (its loss does not shift them)
later = inputs.clone()
later[:, 6:] = torch.randint(3, 128, (1, 6), generator=g)  # the same first 6 tokens, the last 6 changed
ok = True
with torch.no_grad():
    plain = m(input_ids=inputs).logits
    for what, kw in (("without labels (scoring)", {}), ("with labels (training)", {"labels": labels})):
        a, b = m(input_ids=inputs, **kw), m(input_ids=later, **kw)
        leak = (a.logits[:, :6] - b.logits[:, :6]).abs().max().item()
        ok &= leak == 0
        print(f"{what}: logits at 0..5 when tokens 6..11 change: expected 0, actual {leak:.3g} "
              f"(their scale {a.logits.abs().max().item():.3g})" + (f"; the loss {a.loss.item():.4f} -> "
                                                                    f"{b.loss.item():.4f}" if kw else ""))
    same = (m(input_ids=inputs, labels=labels).logits - plain).abs().max().item()
    ok &= same == 0
    print(f"logits with labels against without: expected 0 (labels must not change the attention), actual {same:.3g}")
    out = m.generate(inputs, max_new_tokens=4, do_sample=False)
    print(f"generate (greedy, 4 new tokens, the prompt attended both ways by design): {out[0, 12:].tolist()}")
print("OK: each position sees only the tokens up to it" if ok else
      "BUG: a position attends to the tokens after it (the token it predicts among them)")
sys.exit(0 if ok else 1)
