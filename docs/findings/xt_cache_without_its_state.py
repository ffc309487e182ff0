"""x-transformers: two options whose output needs more than the cached keys and values say
can_cache_kv=True, so a cached decode (AutoregressiveWrapper.generate's default) silently
differs from the full forward: the data-dependent ALiBi of the forgetting transformer
(attn_data_dependent_alibi) and token shifting (shift_tokens). Exit 1 while a model that says it
can cache decodes differently from its full forward, 0 once it either agrees or says it cannot.

x-transformers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/xt_cache_without_its_state.py
Attention.forward computes the data-dependent bias from the new tokens alone
(self.data_dependent_alibi(x)): their forget gates' cumulative sum restarts at the first new token,
and a single new token gets a zero bias to every cached key. ShiftTokens shifts features within the
tokens it is given: the first new token receives zeros instead of the last cached token's features.
Neither keeps that state in the cache, and Attention.can_cache_kv is `not selective` only.
"""
import sys

import torch
from x_transformers import Decoder, TransformerWrapper

TOL = 1e-5   # float32: the same sums in another order


def cached_error(**opts):
    torch.manual_seed(0)
    model = TransformerWrapper(num_tokens=64, max_seq_len=64, attn_layers=Decoder(
        dim=256, depth=2, heads=4, attn_dim_head=64, **opts)).eval()
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(x)
        _, cache = model(x[:, :15], return_intermediates=True)   # prefill 15, then one token through the cache
        step = model(x, cache=cache, return_intermediates=True)[0][:, -1]
    return model.can_cache_kv, float((step - full[:, -1]).abs().max() / full[:, -1].abs().max())


ok = True
for opts in ({"rotary_pos_emb": True}, {"attn_data_dependent_alibi": True}, {"shift_tokens": 1}):
    try:
        can, err = cached_error(**opts)
    except AssertionError as e:
        print(f"{opts}: not in this release ({str(e).splitlines()[0][:60]})")
        continue
    good = err <= TOL or not can
    ok &= good
    print(f"{opts}: can_cache_kv={can}; cached step against the full forward: expected <= {TOL:g} "
          f"(or can_cache_kv=False), actual {err:.3g}")
print("OK" if ok else "BUG: can_cache_kv=True, but the cached decode differs from the full forward")
sys.exit(0 if ok else 1)
