"""x-transformers 1.25.4 to 1.27.5 with rotary_xpos raise NameError in the rotary embedding's forward
(lucidrains/x-transformers #226): letting the rotary embedding take custom positions (1.25.4) dropped
the line that defined seq_len, which the xpos scale still reads; 1.27.6 defines it again.

A two-layer Decoder with rotary_xpos=True (not the default; xpos needs a causal decoder), random
weights: a plain forward must run. Exit 1: the bug is present (the forward raises NameError); 0: it
is not; 2: the repro could not run."""
import os
import sys

import torch

try:
    import x_transformers
    from x_transformers import Decoder, TransformerWrapper
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)


def main() -> int:
    torch.manual_seed(0)
    model = TransformerWrapper(num_tokens=64, max_seq_len=32,
                               attn_layers=Decoder(dim=32, depth=2, heads=4, rotary_xpos=True)).eval()
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    where = os.path.dirname(os.path.dirname(x_transformers.__file__))  # x-transformers has no __version__
    try:
        with torch.no_grad():
            out = model(ids)
    except NameError as e:   # the bug: the xpos scale reads a name the forward no longer defines
        print(f"x-transformers from {where} (rotary_xpos): the forward raised NameError: {e}")
        return 1
    print(f"x-transformers from {where} (rotary_xpos): the forward ran, logits {tuple(out.shape)}, "
          f"finite: {bool(torch.isfinite(out).all())}")
    return int(not torch.isfinite(out).all())


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything else raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
