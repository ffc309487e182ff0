"""RwkvForCausalLM: a cached step of one token is wrong for every batch of more than one sequence,
and so is batched generate(). Exit 1 while it is (the bug), 0 when every row's cached step matches
the full forward and batched greedy decoding matches each prompt decoded alone.

transformers 5.23.0 and 5.25.0, torch (CPU); random weights from RWKV-4-169m's widths (hidden 768)
with 2 layers and a small vocabulary, no download; seconds. Run as is:
    python docs/findings/rwkv_batched_cached_step.py
RwkvSelfAttention.extract_key_value and RwkvFeedForward.forward take the token shift of a one-token
step from the state as state[i][:, :, layer_id], shape (batch, hidden), without the time axis: mixed
with hidden (batch, 1, hidden) it broadcasts to (batch, batch, hidden), and the recurrence then runs
over the batch as if it were time. With one sequence the shapes agree, so only batches are wrong.
"""
import sys

import torch
from transformers import RwkvConfig, RwkvForCausalLM

TOL = 1e-5  # a cached step against the full forward: the same recurrence in another order
torch.manual_seed(0)
cfg = RwkvConfig(vocab_size=256, hidden_size=768, num_hidden_layers=2, context_length=64)
m = RwkvForCausalLM(cfg).eval()
x = torch.randint(0, 255, (2, 12), generator=torch.Generator().manual_seed(1))
ok = True
with torch.no_grad():
    full = m(input_ids=x, use_cache=False).logits
    for b in (1, 2):
        pre = m(input_ids=x[:b, :11], use_cache=True)
        step = m(input_ids=x[:b, 11:], state=pre.state, use_cache=True).logits
        if step.shape != full[:b, 11:].shape:
            ok = False
            print(f"batch {b}: prefill 11 + 1 cached step: expected logits {tuple(full[:b, 11:].shape)}, "
                  f"actual {tuple(step.shape)}")
            step = step[:, -1:]   # what generate() reads
        err = ((step - full[:b, 11:]).abs().max() / full[:b].abs().max()).item()
        ok &= err <= TOL
        print(f"batch {b}: prefill 11 + 1 cached step against the full forward: expected <= {TOL:g}, actual {err:.3g}")
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=255)   # a token no prompt holds
    together = m.generate(x[:, :6], **kw)[:, 6:]
    alone = torch.cat([m.generate(x[i:i + 1, :6], **kw)[:, 6:] for i in range(2)])
    same = (together == alone).all(1)
    ok &= bool(same.all())
    print(f"greedy generate(), 8 new tokens, 2 prompts in one batch against each alone: rows that agree "
          f"{int(same.sum())} of 2 (expected 2)")
print("OK: a batch decodes as its rows do alone" if ok else
      "BUG: a one-token cached step mixes the batch (the token shift lacks its time axis)")
sys.exit(0 if ok else 1)
