"""x-transformers: ALiBi's custom positions (`pos`, and the rotary embedding's positions, which
AttentionLayers passes to every block as `pos`) give the bias one row per position, queries
included: in a cached step the queries are only the new tokens, so the (positions x positions) bias
broadcasts the new token's scores to every position. With rotary_pos_emb + alibi_pos_bias a cached
step, and so AutoregressiveWrapper.generate (which caches by default), raises; so does alibi_pos_bias
alone with custom positions pos= and a cache. Exit 1 while a cached step raises or differs from the
full forward, 0 once it agrees.

x-transformers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/xt_alibi_custom_positions_cache.py
Attention.forward: `if exists(pos): attn_bias = rel_pos.forward_custom_pos(pos)`, i.e. queries and
keys both at every position of `pos`; without custom positions `rel_pos(i, j)` takes the last i rows.
"""
import sys

import torch
from x_transformers import AutoregressiveWrapper, Decoder, TransformerWrapper

TOL = 1e-5   # float32: the same sums in another order


def build(**opts):
    torch.manual_seed(0)
    return TransformerWrapper(num_tokens=64, max_seq_len=64, attn_layers=Decoder(
        dim=256, depth=2, heads=4, attn_dim_head=64, **opts)).eval()


def cached_error(model, **kw):
    """Prefill 15 tokens, then the 16th through the cache (the whole sequence, as generate passes it)."""
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    pos = {"pos": kw["pos"]} if "pos" in kw else {}
    with torch.no_grad():
        full = model(x, **pos)[:, -1]
        _, cache = model(x[:, :15], **({"pos": kw["pos"][:15]} if pos else {}), return_intermediates=True)
        step = model(x, **pos, cache=cache)[:, -1]
    return f"{float((step - full).abs().max() / full.abs().max()):.3g}"


def generate_same(model):
    """Greedy generate() with its default KV cache against without it."""
    prompt = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(2))
    wrapper = AutoregressiveWrapper(model)
    with torch.no_grad():
        runs = [wrapper.generate(prompt, 4, cache_kv=c, temperature=0.) for c in (True, False)]
    return "the same tokens" if torch.equal(*runs) else "different tokens"


def attempt(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except Exception as e:  # noqa: BLE001  an error is the call's actual result, compared and printed like a value
        return f"{type(e).__name__}: {str(e).splitlines()[0][:110]}"


def small(actual):
    try:
        return float(actual) <= TOL
    except ValueError:
        return False


ok = True
cases = [
    ("alibi_pos_bias (reference)", dict(alibi_pos_bias=True), {}),
    ("rotary_pos_emb + alibi_pos_bias", dict(rotary_pos_emb=True, alibi_pos_bias=True), {}),
    ("rotary_pos_emb + alibi_pos_bias, attn_flash", dict(rotary_pos_emb=True, alibi_pos_bias=True, attn_flash=True), {}),
    ("alibi_pos_bias, custom positions pos=", dict(alibi_pos_bias=True), {"pos": torch.arange(16)}),
]
for name, opts, kw in cases:
    actual = attempt(cached_error, build(**opts), **kw)
    ok &= small(actual)
    print(f"{name}: cached step against the full forward: expected <= {TOL:g}, actual {actual}")
for name, opts, _ in cases[1:3]:
    actual = attempt(generate_same, build(**opts))
    ok &= actual == "the same tokens"
    print(f"{name}: generate() with and without the cache: expected the same tokens, actual {actual}")
print("OK" if ok else "BUG: ALiBi's custom positions ignore the cache: a cached step raises")
sys.exit(0 if ok else 1)
