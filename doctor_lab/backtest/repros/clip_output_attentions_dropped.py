"""CLIP's encoders return no attention weights when asked for them from transformers 5.0
(huggingface/transformers #43618): output_attentions=True on an eager CLIP vision model gives
attentions None (the output class still declares them).

A tiny CLIP vision model (random weights, eager): output_attentions=True must return one attention
tensor per layer, each row summing to 1. Exit 1: the bug is present; 0: it is not; 2: the repro could
not run."""
import sys

import torch

try:
    import transformers
    from transformers import CLIPVisionConfig, CLIPVisionModel
except ImportError as e:
    print(f"could not run: {e}")
    sys.exit(2)

LAYERS = 2


def main() -> int:
    torch.manual_seed(0)
    cfg = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS, num_attention_heads=4,
                           image_size=16, patch_size=8, projection_dim=16)
    cfg._attn_implementation = "eager"
    model = CLIPVisionModel(cfg).eval()
    pixels = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        inner = getattr(model, "vision_model", model)   # the thread's call: the vision transformer itself (later releases fold it in)
        out = inner(pixel_values=pixels, output_attentions=True)
    att = out.attentions
    ok = att is not None and len(att) == LAYERS and all(
        torch.allclose(a.sum(-1), torch.ones(()), atol=1e-5) for a in att)
    print(f"transformers {transformers.__version__}: output_attentions=True gave "
          f"{'None' if att is None else f'{len(att)} tensors'} for {LAYERS} layers")
    return int(not ok)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
