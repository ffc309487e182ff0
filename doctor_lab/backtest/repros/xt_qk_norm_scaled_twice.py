"""x-transformers 2.17.1 to 2.25.4 with qk_norm (cosine-similarity attention) scale the normalised
queries and keys by qk_norm_scale and then pass the same scale to the attention as well: the scores
are qk_norm_scale**3 times the cosine (1000 x at the default 10) instead of qk_norm_scale times it, so
every softmax is nearly one-hot (lucidrains/x-transformers #352; the line came in with k_rmsnorm).

A one-layer Decoder with attn_qk_norm=True (not the default), random weights: its pre-softmax scores
(the visible ones; masked ones are filled with a large negative value) must stay within
qk_norm_scale (10) in magnitude, since each is qk_norm_scale times a cosine.
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import os
import sys

import torch

try:
    import x_transformers
    from x_transformers import Decoder, TransformerWrapper
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

QK_NORM_SCALE = 10  # x-transformers' default qk_norm_scale
SLACK = 1e-3        # a cosine is at most 1 up to rounding


def main() -> int:
    torch.manual_seed(0)
    model = TransformerWrapper(num_tokens=64, max_seq_len=32,
                               attn_layers=Decoder(dim=32, depth=1, heads=4, attn_qk_norm=True)).eval()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, inter = model(ids, return_intermediates=True)
    scores = inter.attn_intermediates[0].pre_softmax_attn
    visible = scores[scores > -1e4]
    top = float(visible.abs().max())
    where = os.path.dirname(os.path.dirname(x_transformers.__file__))  # x-transformers has no __version__
    print(f"x-transformers from {where} (qk_norm): largest visible pre-softmax score {top:.4g} "
          f"(at most qk_norm_scale {QK_NORM_SCALE})")
    return int(top > QK_NORM_SCALE * (1 + SLACK))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
