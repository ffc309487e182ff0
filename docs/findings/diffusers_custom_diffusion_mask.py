"""diffusers: the Custom Diffusion attention processors do not prepare the attention mask as
AttnProcessor / AttnProcessor2_0 do. As cross-attention (a text context, the use Custom Diffusion
trains), a mask over the context raises whenever the context is not as long as the image tokens;
and CustomDiffusionAttnProcessor2_0 raises on any mask with a batch of more than one. Exit 1 while
they do, 0 once each gives AttnProcessor2_0's output on the same weights.

diffusers and torch only; random weights, no download; seconds on CPU. Run as is:
    python docs/findings/diffusers_custom_diffusion_mask.py
Both __call__s take `batch_size, sequence_length, _ = hidden_states.shape` and pass that
sequence_length to attn.prepare_attention_mask (AttnProcessor2_0 takes the context's length when
there is a context), which then pads a text-length mask by the image length. CustomDiffusionAttnProcessor2_0
then hands the (batch * heads, 1, keys) mask to scaled_dot_product_attention without the
.view(batch_size, attn.heads, -1, keys) AttnProcessor2_0 applies.
"""
import sys

import torch
from diffusers.models.attention_processor import (
    Attention,
    AttnProcessor2_0,
    CustomDiffusionAttnProcessor,
    CustomDiffusionAttnProcessor2_0,
)

TOL = 1e-5
torch.manual_seed(0)
B, N, S, C = 2, 16, 6, 256   # image tokens, text tokens, width (heads of 64, as Stable Diffusion 2's)
x, text = torch.randn(B, N, C), torch.randn(B, S, C)
keep = torch.ones(B, S)
keep[0, 4:] = 0   # row 0's last two text tokens are padding
bias = ((1 - keep) * -10000.0)[:, None, :]   # as UNet2DConditionModel passes encoder_attention_mask
ok = True
for cls in (CustomDiffusionAttnProcessor, CustomDiffusionAttnProcessor2_0):
    for context in (None, text):
        attn = Attention(C, cross_attention_dim=None if context is None else C, heads=4, dim_head=64)
        # train_kv=False, train_q_out=False: the processor uses attn's own projections, so the
        # reference is the same module with AttnProcessor2_0
        attn.set_processor(cls(train_kv=False, train_q_out=False, hidden_size=C, cross_attention_dim=C))
        mask = bias if context is not None else torch.zeros(B, 1, N)
        with torch.no_grad():
            try:
                got = attn(x, encoder_hidden_states=context, attention_mask=mask)
                attn.set_processor(AttnProcessor2_0())
                ref = attn(x, encoder_hidden_states=context, attention_mask=mask)
                actual = f"{float((got - ref).abs().max() / ref.abs().max()):.3g}"
                good = float((got - ref).abs().max() / ref.abs().max()) <= TOL
            except RuntimeError as e:
                actual, good = f"RuntimeError: {str(e).splitlines()[0][:90]}", False
        ok &= good
        what = "self-attention, a mask over the image tokens" if context is None else \
            f"cross-attention, a mask over {S} text tokens ({N} image tokens)"
        print(f"{cls.__name__}, batch {B}, {what}: against AttnProcessor2_0 expected <= {TOL:g}, actual {actual}")
print("OK" if ok else "BUG: the Custom Diffusion processors prepare the attention mask for the wrong length and layout")
sys.exit(0 if ok else 1)
