"""x-transformers: the positions AttentionLayers makes for its rotary (and polar, PoPE) embedding.
(1) They go on to every attention block as `pos`, where only ALiBi accepts custom positions:
rotary_pos_emb or polar_pos_emb with the T5 relative bias (rel_pos_bias) or the dynamic position bias
builds, then raises on every forward.
(2) They count from the first slot whatever seq_start_pos (x-transformers' left padding) says: with
memory key/values (attn_num_mem_kv, whose keys are not rotated) a left-padded row's real tokens
differ from the unpadded row's. Exit 1 while either happens, 0 once both behave.

x-transformers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/xt_rotary_positions.py
AttentionLayers.forward: `if not exists(pos): pos = arange(...) - mem_len; rotary_pos_emb =
self.rotary_pos_emb(pos)` (the polar block: `pos = arange(...)`, `self.polar_pos_emb(pos)`), then every
self-attention block gets `pos = pos`; Attention.forward asserts
`isinstance(rel_pos, AlibiPositionalBias)` when it is given positions. seq_start_pos only masks keys.
"""
import sys

import torch
from x_transformers import Decoder, TransformerWrapper

TOL = 1e-5


def build(**opts):
    torch.manual_seed(0)
    return TransformerWrapper(num_tokens=64, max_seq_len=64, attn_layers=Decoder(
        dim=128, depth=2, heads=2, attn_dim_head=64, **opts)).eval()   # x-transformers' default head size


ok = True
x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
for opts in [{emb: True, bias: True} for emb in ("rotary_pos_emb", "polar_pos_emb")
             for bias in ("alibi_pos_bias", "rel_pos_bias", "dynamic_pos_bias")]:
    try:
        with torch.no_grad():
            out = build(**opts)(x)
        actual = "runs" if torch.isfinite(out).all() else "non-finite output"
    except Exception as e:  # noqa: BLE001  the bug raises: its error is the actual result, printed, then BUG
        actual = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
    ok &= actual == "runs"
    print(f"{opts}: expected runs, actual {actual}")

real = x[:1, :12]
P = 4
padded = torch.cat([torch.zeros(1, P, dtype=torch.long), real], 1)
for opts in ({"rotary_pos_emb": True}, {"rotary_pos_emb": True, "attn_num_mem_kv": 2}):
    model = build(**opts)
    with torch.no_grad():
        ref = model(real)
        got = model(padded, seq_start_pos=torch.tensor([P]))[:, P:]
        # generate's route for ragged prompts: a cached step after the left-padded prompt
        nxt = x[:1, 12:13]
        _, cache = model(padded, seq_start_pos=torch.tensor([P]), return_intermediates=True)
        step, _ = model(torch.cat([padded, nxt], 1), cache=cache, seq_start_pos=torch.tensor([P]),
                        return_intermediates=True)
        step_ref = model(torch.cat([real, nxt], 1))[:, -1]
    for what, a, b in (("real tokens", got, ref), ("a cached step after them", step[:, -1], step_ref)):
        err = float((a - b).abs().max() / b.abs().max())
        ok &= err <= TOL
        print(f"{opts}, left padding as seq_start_pos: {what} against the unpadded row: expected <= {TOL:g}, "
              f"actual {err:.3g}")
print("OK" if ok else "BUG: AttentionLayers' rotary and polar positions reach the blocks; rotary's ignore seq_start_pos")
sys.exit(0 if ok else 1)
