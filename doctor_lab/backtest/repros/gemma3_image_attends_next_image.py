"""Gemma3 with two images a few tokens apart: its image tokens attend bidirectionally within their own
image only (an image cannot see a later one: huggingface/transformers #38053, fixed in 4.52). In 4.53
the mask is a masking_utils mask function (#38295 reworked it for that refactor) that calls two image
tokens the same image when they are at most mm_tokens_per_image apart, so the last tokens of one image
see the first tokens of the next; 4.54's function groups the image tokens by image again.

Random weights from a small config (a 1-layer SigLIP tower on 16x16 images, 4 tokens per image, a
2-layer text model; the projector, initialised to zeros, drawn at random so that images reach the
text model). The input is text, <boi> 4 image tokens <eoi>, <boi> 4 image tokens <eoi>, text, with
token_type_ids marking the image tokens; the second image's pixels are then redrawn. Every logit
before the second image must stay where it was (eager and sdpa, the larger gap).
Tolerance 1e-4: the same computation twice gives 0 here; the bug moves those logits by ~1.
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch

try:
    import transformers
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-4
IMG, BOI, EOI = 60, 61, 62
TEXT = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=128, sliding_window=64,
            query_pre_attn_scalar=8, initializer_range=0.2)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, image_size=16,
              patch_size=4)


def gap(impl) -> float:
    cfg = Gemma3Config(text_config=TEXT, vision_config=VISION, mm_tokens_per_image=4, image_token_index=IMG,
                       boi_token_index=BOI, eoi_token_index=EOI, initializer_range=0.2)
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration._from_config(cfg, attn_implementation=impl).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "mm_input_projection" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)) * 0.3)
    g = torch.Generator().manual_seed(1)
    ids = torch.tensor([[2, 5, 6, BOI] + [IMG] * 4 + [EOI, BOI] + [IMG] * 4 + [EOI, 7, 8]])
    second = 10                                          # where the second image's tokens start
    pixels = torch.randn(2, 3, 16, 16, generator=g)
    other = pixels.clone()
    other[1] = torch.randn(3, 16, 16, generator=g)
    kw = dict(input_ids=ids, token_type_ids=(ids == IMG).long(), attention_mask=torch.ones_like(ids))
    with torch.no_grad():
        a = model(pixel_values=pixels, **kw).logits[0, :second]
        b = model(pixel_values=other, **kw).logits[0, :second]
        c = model(pixel_values=other, **kw).logits[0]
        moved_after = float((model(pixel_values=pixels, **kw).logits[0, second:] - c[second:]).abs().max())
    if moved_after <= TOL:
        raise RuntimeError("the second image changes nothing after it either: the images do not reach the model")
    return float((a - b).abs().max())


def main() -> int:
    gaps = {impl: gap(impl) for impl in ("eager", "sdpa")}
    print(f"transformers {transformers.__version__}: redrawing the second image moves the logits before it by "
          + ", ".join(f"{k} {d:.3g}" for k, d in gaps.items()) + f" (tolerance {TOL})")
    return int(max(gaps.values()) > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
