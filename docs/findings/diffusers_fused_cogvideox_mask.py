"""diffusers: FusedCogVideoXAttnProcessor2_0 raises on any attention mask, where
CogVideoXAttnProcessor2_0 (the same attention with separate projections) takes it. Exit 1 while the
fused processor raises or differs from the unfused one on the same weights, 0 once they agree.

diffusers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/diffusers_fused_cogvideox_mask.py
After concatenating text and video tokens, FusedCogVideoXAttnProcessor2_0.__call__ takes
`batch_size, sequence_length, _ = hidden_states.shape if encoder_hidden_states is None else
encoder_hidden_states.shape`: the text's length, not the joint sequence's, so prepare_attention_mask
pads the mask by that length and its view(batch, heads, -1, keys) does not fit.
CogVideoXAttnProcessor2_0 takes hidden_states.shape after the concatenation.
"""
import sys

import torch
from diffusers.models.attention_processor import Attention, CogVideoXAttnProcessor2_0, FusedCogVideoXAttnProcessor2_0

TOL = 1e-5
torch.manual_seed(0)
B, N, S, C = 2, 12, 4, 256   # video tokens, text tokens, width (heads of 64, as CogVideoX's)
attn = Attention(C, heads=4, dim_head=64, qk_norm="layer_norm", processor=CogVideoXAttnProcessor2_0())
video, text = torch.randn(B, N, C), torch.randn(B, S, C)
keep = torch.ones(B, S + N)
keep[0, 2:S] = 0   # row 0: two padded text tokens (the mask covers text then video, as the keys are)
ok = True
for mask in (None, ((1 - keep) * -10000.0)[:, None, :]):
    with torch.no_grad():
        attn.set_processor(CogVideoXAttnProcessor2_0())
        ref = attn(video, encoder_hidden_states=text, attention_mask=mask)[0]
        attn.fuse_projections()
        attn.set_processor(FusedCogVideoXAttnProcessor2_0())
        try:
            err = float((attn(video, encoder_hidden_states=text, attention_mask=mask)[0] - ref).abs().max() / ref.abs().max())
            actual, good = f"{err:.3g}", err <= TOL
        except RuntimeError as e:
            actual, good = f"RuntimeError: {str(e).splitlines()[0][:90]}", False
    ok &= good
    print(f"{'no mask' if mask is None else 'a mask over text and video'}: fused against unfused expected "
          f"<= {TOL:g}, actual {actual}")
print("OK" if ok else "BUG: FusedCogVideoXAttnProcessor2_0 prepares the mask for the text's length")
sys.exit(0 if ok else 1)
