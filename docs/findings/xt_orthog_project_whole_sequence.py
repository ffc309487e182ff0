"""x-transformers: the orthogonal projections (attn_orthog_projected_values, its _per_head variant,
and the orthog_residual update) project over the whole sequence at once, so a causal Decoder's
early outputs depend on later tokens and a cached decode disagrees with the full forward.
Exit 1 while they do, 0 once each position's projection uses its own vectors only.

x-transformers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/xt_orthog_project_whole_sequence.py
orthog_project(x, y) packs with 'b *': every token's features of a row become one vector, and x is
projected off the normalised y of the whole row. The papers' projection (Oh et al. 2025, and the
"belief" values) is per token, over the feature axis: pack with '* d'.
"""
import sys

import torch
from x_transformers import Decoder, TransformerWrapper

TOL = 1e-6   # float32: a causal model's outputs before t do not move when tokens from t on change


def absent(e: Exception) -> bool:
    """An option this release does not have yet (AttentionLayers asserts, Attention raises TypeError)."""
    return "unrecognized kwargs" in str(e) or "unexpected keyword argument" in str(e)


def build(**opts):
    torch.manual_seed(0)
    return TransformerWrapper(num_tokens=64, max_seq_len=64, attn_layers=Decoder(
        dim=256, depth=2, heads=4, attn_dim_head=64, **opts)).eval()


def measure(model):
    """(how much the first 8 outputs move when tokens 8.. change, cached step's error)"""
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    later = x.clone()
    later[:, 8:] = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(x)
        moved = (model(later)[:, :8] - full[:, :8]).abs().max() / full[:, :8].abs().max()
        _, cache = model(x[:, :15], return_intermediates=True)
        step = model(x, cache=cache, return_intermediates=True)[0][:, -1]
        cached = (step - full[:, -1]).abs().max() / full[:, -1].abs().max()
    return float(moved), float(cached)


ok, seen = True, 0
for opts in ({}, {"attn_orthog_projected_values": True}, {"attn_orthog_projected_values_per_head": True},
             {"orthog_residual": True}):
    try:
        moved, cached = measure(build(**opts))
    except (AssertionError, TypeError) as e:
        if not absent(e):
            raise
        print(f"{opts}: not in this release")
        continue
    seen += bool(opts)
    ok &= moved <= TOL and cached <= 1e-5
    print(f"{opts}: expected <= {TOL:g} / <= 1e-05, actual: earlier outputs move by {moved:.3g}, "
          f"cached step against the full forward {cached:.3g}")
print("OK: each position is projected on its own" if ok else
      "BUG: orthog_project projects over the whole sequence (a causal model sees the future)")
sys.exit(2 if not seen else 0 if ok else 1)
