"""x-transformers: with flash=True, gumbel-softmax attention (attn_gumbel_softmax=True) and a custom
attention function (attn_custom_attn_fn=...) are accepted and silently replaced by plain softmax
attention (scaled_dot_product_attention). Exit 1 while a flash model computes something else than
the same model without flash, 0 once each either agrees or is refused at construction, as sigmoid,
hard, top-k and talking-heads attention are.

x-transformers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/xt_flash_drops_attn_fn.py
Attend.__init__ asserts `not (flash and sigmoid)`, `not (flash and hard)`, `not (flash and
is_sparse_topk_attn)`, but not for gumbel_softmax or custom_attn_fn, both of which only set
self.attn_fn; Attend.forward returns self.flash_attn(q, k, v, ...) before attn_fn is ever used.
"""
import sys

import torch
from x_transformers import Decoder, TransformerWrapper

TOL = 1e-5


def absent(e: Exception) -> bool:
    """An option this release does not have yet (AttentionLayers asserts, Attention raises TypeError)."""
    return "unrecognized kwargs" in str(e) or "unexpected keyword argument" in str(e)


def halve(s):   # a custom attention: softmax at half the temperature
    return (s * 2).softmax(dim=-1)


def build(flash, **opts):
    torch.manual_seed(0)
    model = TransformerWrapper(num_tokens=64, max_seq_len=64, attn_layers=Decoder(
        dim=256, depth=2, heads=4, attn_dim_head=64, attn_flash=flash, **opts)).eval()
    return model


x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
ok, seen = True, 0
for opts in ({"attn_custom_attn_fn": halve}, {"attn_gumbel_softmax": True, "attn_gumbel_softmax_hard": False}):
    name = ", ".join(f"{k}={getattr(v, '__name__', v)}" for k, v in opts.items())
    try:
        flash = build(True, **opts)
    except (AssertionError, TypeError) as e:
        if absent(e):
            print(f"{name}: not in this release")
            continue
        print(f"{name}, flash=True: refused ({str(e).splitlines()[0][:70]}): OK")
        seen += 1
        continue
    seen += 1
    with torch.no_grad():
        torch.manual_seed(3)
        a = flash(x)
        torch.manual_seed(3)   # the same gumbel noise, were it drawn
        b = build(False, **opts)(x)
        torch.manual_seed(3)
        plain = build(False)(x)
    d, dp = float((a - b).abs().max() / b.abs().max()), float((a - plain).abs().max() / plain.abs().max())
    ok &= d <= TOL
    print(f"{name}: flash=True against flash=False expected <= {TOL:g} (or refused), actual {d:.3g}; "
          f"against plain softmax attention {dp:.3g}")
print("OK" if ok else "BUG: flash=True silently drops gumbel softmax and custom attention functions")
sys.exit(2 if not seen else 0 if ok else 1)
