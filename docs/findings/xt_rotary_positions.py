"""x-transformers: the positions AttentionLayers makes for its rotary embedding. (1) They go on to
every attention block as `pos`, where only ALiBi accepts custom positions: rotary_pos_emb with the T5
relative bias (rel_pos_bias) or the dynamic position bias builds, then raises on every forward.
(2) They count from the first slot whatever seq_start_pos (x-transformers' left padding) says: with
memory key/values (attn_num_mem_kv, whose keys are not rotated) a left-padded row's real tokens
differ from the unpadded row's. Exit 1 while either happens, 0 once both behave.

x-transformers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/xt_rotary_positions.py
AttentionLayers.forward: `if not exists(pos): pos = arange(...) - mem_len; rotary_pos_emb =
self.rotary_pos_emb(pos)`, then every self-attention block gets `pos = pos`; Attention.forward asserts
`isinstance(rel_pos, AlibiPositionalBias)` when it is given positions. seq_start_pos only masks keys.
"""
import sys

import torch
from x_transformers import Decoder, TransformerWrapper

TOL = 1e-5


def build(**opts):
    torch.manual_seed(0)
    return TransformerWrapper(num_tokens=64, max_seq_len=64, attn_layers=Decoder(
        dim=32, depth=2, heads=4, attn_dim_head=8, **opts)).eval()


ok = True
x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
for opts in ({"rotary_pos_emb": True, "alibi_pos_bias": True}, {"rotary_pos_emb": True, "rel_pos_bias": True},
             {"rotary_pos_emb": True, "dynamic_pos_bias": True}):
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
    err = float((got - ref).abs().max() / ref.abs().max())
    ok &= err <= TOL
    print(f"{opts}, left padding as seq_start_pos: real tokens against the unpadded row: expected <= {TOL:g}, "
          f"actual {err:.3g}")
print("OK" if ok else "BUG: AttentionLayers' rotary positions reach the blocks, and ignore seq_start_pos")
sys.exit(0 if ok else 1)
