"""Wan (and SkyReels-V2) in diffusers 0.35 rotate each head with 3D RoPE split into frame, row and
column parts by one formula at init (2 * (d // 6) for rows and columns) and another in forward
(d // 3): for a head size d with d % 6 in (3, 4, 5) the parts no longer line up, so some channels
meant to carry the frame index carry the row index instead (huggingface/diffusers #12594; it came
with the real-valued RoPE of 0.35).

WanRotaryPosEmbed for d = 16 (not the default 128) over a 3 x 4 x 4 grid of patches: the frame part
of every token's rotation (its first d - 4 * (d // 6) channels, as __init__ lays them out) must be the
same for every token of a frame.
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch

try:
    import diffusers
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

D, FRAMES, ROWS, COLS = 16, 3, 4, 4
TOL = 1e-6


def frame_part() -> torch.Tensor:
    """(frames, rows * cols, channels): the frame part's rotation angles, from either layout."""
    rope = WanRotaryPosEmbed(attention_head_dim=D, patch_size=(1, 1, 1), max_seq_len=32)
    out = rope(torch.zeros(1, 4, FRAMES, ROWS, COLS))
    t_dim = D - 4 * (D // 6)
    if isinstance(out, tuple):   # 0.35 on: (cos, sin), each (1, tokens, 1, D), every frequency twice
        part = torch.atan2(out[1], out[0])[0, :, 0, :t_dim]
    else:                        # up to 0.34: complex (1, 1, tokens, D / 2), one per frequency
        part = torch.angle(out[0, 0, :, : t_dim // 2])
    return part.reshape(FRAMES, ROWS * COLS, -1).float()


def main() -> int:
    part = frame_part()
    spread = float((part - part[:, :1]).abs().max())
    print(f"diffusers {diffusers.__version__}: Wan's frame channels' angles vary by {spread:.3g} across the tokens of one "
          f"frame (head size {D}; tolerance {TOL})")
    return int(spread > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
