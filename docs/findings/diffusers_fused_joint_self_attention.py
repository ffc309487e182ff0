"""diffusers: SD3Transformer2DModel.fuse_qkv_projections() changes what Stable Diffusion 3.5 computes.
FusedJointAttnProcessor2_0, which it sets on every attention, is not JointAttnProcessor2_0 with fused
projections: (1) it needs encoder_hidden_states, which the self-attention of SD3.5's dual-attention
blocks (attn2, dual_attention_layers, as in 3.5 Medium) does not pass, so every forward raises;
(2) it skips the q/k norms (qk_norm="rms_norm", as in 3.5 Medium and Large), so the outputs change.
Exit 1 while the fused model raises or differs from the unfused one, 0 once it agrees.

diffusers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/diffusers_fused_joint_self_attention.py
FusedJointAttnProcessor2_0.__call__ reads encoder_hidden_states.ndim and .shape[0] and projects it
with attn.to_added_qkv unconditionally, and never calls attn.norm_q / norm_k / norm_added_q /
norm_added_k; JointAttnProcessor2_0 guards each context use with `if encoder_hidden_states is not
None` and applies the four norms.
"""
import sys

import torch
from diffusers import SD3Transformer2DModel

TOL = 1e-4   # float32, fused against separate projections: rounding of the same sums
ok = True
for dual, qk_norm in (((), None), ((0,), None), ((), "rms_norm")):
    torch.manual_seed(0)
    model = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=64,
                                  num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=128,
                                  pooled_projection_dim=8, out_channels=4, pos_embed_max_size=8,
                                  dual_attention_layers=dual, qk_norm=qk_norm).eval()
    g = torch.Generator().manual_seed(1)
    inputs = dict(hidden_states=torch.randn(1, 4, 8, 8, generator=g), encoder_hidden_states=torch.randn(1, 5, 16, generator=g),
                  pooled_projections=torch.randn(1, 8, generator=g), timestep=torch.tensor([10]))
    with torch.no_grad():
        ref = model(**inputs).sample
        model.fuse_qkv_projections()
        try:
            err = float((model(**inputs).sample - ref).abs().max() / ref.abs().max())
            actual, good = f"{err:.3g}", err <= TOL
        except Exception as e:  # noqa: BLE001  whatever the fused path raises is the actual result: printed, then BUG
            actual, good = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}", False
    ok &= good
    print(f"dual_attention_layers={dual}, qk_norm={qk_norm}: fused against unfused expected <= {TOL:g}, actual {actual}")
print("OK" if ok else "BUG: FusedJointAttnProcessor2_0 needs a context and skips the q/k norms")
sys.exit(0 if ok else 1)
