"""x-transformers: gumbel-softmax attention (attn_gumbel_softmax=True) at a temperature below 1
(attn_gumbel_softmax_temp=0.5) turns every parameter gradient NaN when a row's keys are all masked
(a left pad's query, with the padding given as `mask` or as `seq_start_pos`, generate's ragged
prompts), though the loss reads the real positions only. Sampling in eval mode is not tested: the
stochastic hard attention is the option's purpose (its commit, c740e39). Exit 1 while any case
has non-finite gradients, 0 once none does.

x-transformers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/xt_gumbel_softmax_attention.py
Attend.forward fills masked scores with -finfo.max; F.gumbel_softmax computes (scores + noise) / tau,
which for tau < 1 overflows to -inf, and a row of -inf gives 0/0 in the softmax; its forward output is
zeroed afterwards (row_is_entirely_masked), but the backward through the NaN weights is not.
"""
import sys

import torch
from x_transformers import Decoder, TransformerWrapper

P, T = 4, 16   # left pads, sequence length


def build(temp, hard):
    torch.manual_seed(0)   # x-transformers' default head size (attn_dim_head 64)
    return TransformerWrapper(num_tokens=256, max_seq_len=0, attn_layers=Decoder(
        dim=128, depth=2, heads=2, attn_dim_head=64, rotary_pos_emb=True, attn_gumbel_softmax=True,
        attn_gumbel_softmax_temp=temp, attn_gumbel_softmax_hard=hard))


x = torch.randint(0, 256, (2, T), generator=torch.Generator().manual_seed(1))
mask = torch.ones(2, T, dtype=torch.bool)
mask[0, :P] = False   # row 0: P left pads, whose queries see no key
try:
    build(1.0, True)
except TypeError as e:   # Attention(..., gumbel_softmax=) unknown
    print(f"attn_gumbel_softmax: not in this release ({str(e).splitlines()[0][:60]})")
    sys.exit(2)
ok = True
routes = {"mask": {"mask": mask}, "seq_start_pos": {"seq_start_pos": torch.tensor([P, 0])}}
for temp, hard, route in ((1.0, True, "mask"), (1.0, True, "seq_start_pos"), (0.5, True, "mask"),
                          (0.5, True, "seq_start_pos"), (0.5, False, "mask")):
    model = build(temp, hard).train()   # training: the option samples, by design
    model(x, **routes[route])[mask].sum().backward()
    bad = sum(int((~torch.isfinite(p.grad)).sum()) for p in model.parameters() if p.grad is not None)
    ok &= bad == 0
    print(f"temperature {temp}, hard={hard}, left padding as {route}, loss on the real positions: "
          f"expected 0 non-finite parameter gradients, actual {bad}")
print("OK" if ok else "BUG: gumbel-softmax attention below temperature 1 overflows fully masked rows to NaN")
sys.exit(0 if ok else 1)
