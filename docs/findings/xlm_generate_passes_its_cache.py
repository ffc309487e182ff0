"""XLMWithLMHeadModel.generate(): since transformers renamed generate()'s cache keyword to `cache`, the
cache reaches XLM's own `cache` argument, which reads a different protocol: greedy decoding with the
cache (generate()'s default) gives other logits than without it, and a static cache raises. Exit 1
while it does (the bug), 0 when decoding with the cache equals decoding without it.

transformers 5.25.0 (5.23.0 passes: it decodes XLM without a cache either way), torch (CPU); random
weights at the width of XLM's causal checkpoints' heads (xlm-clm-enfr-1024: head size 128) with 2
layers and a small vocabulary, no download; seconds. Run as is:
    python docs/findings/xlm_generate_passes_its_cache.py
XLMWithLMHeadModel.prepare_inputs_for_generation feeds the whole sequence plus a mask token at every
step and forwards every other keyword generate() passes, now `cache`. XLMModel.forward then keeps
what that cache lacks: it runs only the last token, the mask token, and reads the rest from the cache,
where the previous step's mask token stands at the position of the token generated since.
"""
import sys

import torch
from transformers import XLMConfig, XLMWithLMHeadModel

TOL = 1e-5  # decoding with the cache against without it: the same sums in another order
torch.manual_seed(0)
cfg = XLMConfig(vocab_size=256, emb_dim=256, n_layers=2, n_heads=2, causal=True, max_position_embeddings=512)
m = XLMWithLMHeadModel(cfg).eval()
x = torch.randint(5, 256, (2, 13), generator=torch.Generator().manual_seed(1))
# a trained model does not predict its mask token; random weights do (argmax 0 = mask_token_id), and a
# generated mask token is what the stale cache entry holds anyway: suppressed, as a trained model's is
kw = dict(max_new_tokens=4, do_sample=False, output_scores=True, return_dict_in_generate=True,
          suppress_tokens=[cfg.mask_token_id])
ok = True


def rel(scores, ref):
    """The largest difference of two runs' logits over the largest logit (the suppressed token's -inf left out)."""
    a, b = torch.stack(scores, 1), ref
    seen = torch.isfinite(b)
    return ((a - b)[seen].abs().max() / b[seen].abs().max()).item() if torch.isfinite(a[seen]).all() else float("inf")


with torch.no_grad():
    uncached = m.generate(x, use_cache=False, **kw)
    cached = m.generate(x, **kw)   # use_cache=True, generate()'s default
    ref = torch.stack(uncached.scores, 1)
    err = rel(cached.scores, ref)
    ok &= err <= TOL
    print(f"greedy generate(), 4 new tokens: logits with the cache against without it: expected <= {TOL:g}, "
          f"actual {err:.3g}")
    try:
        static = m.generate(x, cache_implementation="static", **kw)
        err = rel(static.scores, ref)
        ok &= err <= TOL
        print(f"generate(cache_implementation='static'): against without a cache: expected <= {TOL:g}, "
              f"actual {err:.3g}")
    except RuntimeError as e:
        ok = False
        print(f"generate(cache_implementation='static'): expected to decode, actual RuntimeError: "
              f"{str(e).splitlines()[0][:120]}")
print("OK: XLM decodes the same with generate()'s cache and without it" if ok else
      "BUG: generate() hands its cache to XLM's own `cache` argument, which reads another protocol")
sys.exit(0 if ok else 1)
