"""x-transformers: gumbel-softmax attention (attn_gumbel_softmax=True) draws its Gumbel noise in
eval mode too, so two eval calls on the same input differ; and at a temperature below 1
(attn_gumbel_softmax_temp=0.5) a row whose keys are all masked (a left pad's query) turns every
parameter gradient NaN, though the loss reads the real positions only. Exit 1 while either
happens, 0 once eval is deterministic and the gradients finite.

x-transformers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/xt_gumbel_softmax_attention.py
Attend.__init__ sets attn_fn = partial(F.gumbel_softmax, tau=temp, hard=...), used whatever
self.training says. Masked scores are filled with -finfo.max; gumbel_softmax computes
(scores + noise) / tau, which for tau < 1 overflows to -inf, and a row of -inf gives 0/0.
"""
import sys

import torch
from x_transformers import Decoder, TransformerWrapper


def build(**opts):
    torch.manual_seed(0)
    return TransformerWrapper(num_tokens=64, max_seq_len=64, attn_layers=Decoder(
        dim=32, depth=2, heads=4, attn_dim_head=8, attn_gumbel_softmax=True, **opts)).eval()


x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
ok = True
try:
    model = build()
except TypeError as e:   # Attention(..., gumbel_softmax=) unknown
    print(f"attn_gumbel_softmax: not in this release ({str(e).splitlines()[0][:60]})")
    sys.exit(2)
with torch.no_grad():
    d = float((model(x) - model(x)).abs().max())
ok &= d == 0
print(f"two eval calls on the same input: expected bit-identical, actual differ by {d:.3g}")

mask = torch.ones(2, 16, dtype=torch.bool)
mask[0, :4] = False   # row 0 left-padded: its pads' queries see no key
for temp in (1.0, 0.5):
    for mode in ("eval", "train"):   # training samples the noise by design; its gradients must be finite too
        model = build(attn_gumbel_softmax_temp=temp).train(mode == "train")
        out = model(x, mask=mask)
        out[mask].sum().backward()
        bad = sum(int((~torch.isfinite(p.grad)).sum()) for p in model.parameters() if p.grad is not None)
        ok &= bad == 0
        print(f"temperature {temp}, {mode} mode, left-padded batch, loss on the real positions: expected 0 "
              f"non-finite parameter gradients, actual {bad}")
print("OK" if ok else "BUG: gumbel-softmax attention samples in eval, and overflows masked scores at temperature < 1")
sys.exit(0 if ok else 1)
