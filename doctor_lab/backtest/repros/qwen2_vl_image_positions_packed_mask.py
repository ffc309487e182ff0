"""Qwen2-VL and Qwen2.5-VL given an image, no attention mask and no cache (use_cache=False, as in
training): the packed-sequence detection added to the mask builder (huggingface/transformers #39194)
reads the model's M-RoPE position ids. In 4.53.1-4.53.3 their 3 rows make it raise (#39685 reports the
error for Qwen2.5-VL in 4.53.3); from 4.54.0 the model hands it their temporal row, which does not
step by 1 over an image's tokens, so the row is cut into "packed sequences" at the image. In 4.57.1
(#40490) the model passes no position ids to the mask builder unless the caller gives text positions.

Each model, random weights from a small config (a 1-layer vision tower, a 2-layer text model), reads
4 text tokens, one 4x4-patch image (4 tokens after the 2x2 merge) between its start and end tokens,
then 5 text tokens: its logits with no mask must equal its logits with an all-ones mask (the largest
gap of the two models; eager and sdpa). A raise from inside transformers' mask builder
(masking_utils) counts as the bug.
Tolerance 1e-4: the same computation twice gives 0 here; the bug moves logits by ~5.
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch

try:
    import transformers
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
    )
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-4
TEXT = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2,
            rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]})
TOKENS = dict(image_token_id=100, video_token_id=101, vision_start_token_id=102, vision_end_token_id=103)
VISION = {
    "qwen2_vl": dict(depth=1, embed_dim=32, hidden_size=32, num_heads=4, mlp_ratio=2, patch_size=2,
                     spatial_merge_size=2, temporal_patch_size=2, in_chans=3),
    "qwen2_5_vl": dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=4, out_hidden_size=32, patch_size=2,
                       spatial_merge_size=2, temporal_patch_size=2, in_channels=3, window_size=8,
                       fullatt_block_indexes=[0]),
}
CLASSES = {"qwen2_vl": (Qwen2VLConfig, Qwen2VLForConditionalGeneration),
           "qwen2_5_vl": (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration)}


def config(name):
    cfg_cls, _ = CLASSES[name]
    try:   # releases with a nested text_config; the flat keys keep older readers of the top level right
        return cfg_cls(text_config=dict(TEXT), vision_config=VISION[name], **TOKENS, **TEXT)
    except TypeError:
        return cfg_cls(vision_config=VISION[name], **TOKENS, **TEXT)


def from_mask_builder(err: BaseException) -> bool:
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith("masking_utils.py"):
            return True
        tb = tb.tb_next
    return False


def gap(name, impl) -> float:
    torch.manual_seed(0)
    model = CLASSES[name][1]._from_config(config(name), attn_implementation=impl).eval()
    g = torch.Generator().manual_seed(1)
    grid = torch.tensor([[1, 4, 4]])                   # 16 patches, 4 tokens after the 2x2 merge
    pixels = torch.randn(16, 3 * 2 * 2 * 2, generator=g)
    ids = torch.cat([torch.randint(3, 90, (1, 4), generator=g), torch.tensor([[102, 100, 100, 100, 100, 103]]),
                     torch.randint(3, 90, (1, 5), generator=g)], 1)
    kw = dict(input_ids=ids, pixel_values=pixels, image_grid_thw=grid, use_cache=False)
    with torch.no_grad():
        masked = model(attention_mask=torch.ones_like(ids), **kw).logits
        try:
            unmasked = model(**kw).logits
        except RuntimeError as e:
            if from_mask_builder(e):
                print(f"  {name}/{impl}: with no mask the mask builder raises {type(e).__name__}: {e}")
                return float("inf")
            raise
    return float((unmasked - masked).abs().max())


def main() -> int:
    gaps = {f"{n}/{i}": gap(n, i) for n in CLASSES for i in ("eager", "sdpa")}
    print(f"transformers {transformers.__version__}: an image, no mask, no cache against an all-ones mask: "
          + ", ".join(f"{k} {d:.3g}" for k, d in gaps.items()) + f" (tolerance {TOL})")
    return int(max(gaps.values()) > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
