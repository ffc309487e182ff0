"""Gemma3's image tokens attend to each other bidirectionally; in 4.53 the bidirectional part of the
mask no longer reaches the attention: the mask passed to the layers is purely causal, so an image
token sees only the image tokens before it (huggingface/transformers #39389, after #37866's mask
refactor).

Gemma3ForConditionalGeneration, 1 layer, eager and SDPA, a 9-token prompt with 4 image positions
(token_type_ids 1) given as embeddings: the first image position's logits must move when the last
image position's embedding changes.
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch
try:
    import transformers
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

IMAGE, BOI, EOI = 63, 61, 62


def model(impl: str):
    cfg = Gemma3Config(
        text_config={"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "sliding_window": 64,
                     "query_pre_attn_scalar": 8, "max_position_embeddings": 64, "pad_token_id": 0},
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 16, "patch_size": 4},
        mm_tokens_per_image=4, image_token_index=IMAGE, boi_token_index=BOI, eoi_token_index=EOI)
    torch.manual_seed(0)
    return Gemma3ForConditionalGeneration._from_config(cfg, attn_implementation=impl).eval()


def reach(impl: str) -> float:
    """How far the first image position's logits move when the last image position's embedding changes."""
    m = model(impl)
    ids = torch.tensor([[2, 5, BOI, IMAGE, IMAGE, IMAGE, IMAGE, EOI, 7]])
    types = (ids == IMAGE).long()
    emb = torch.randn(1, 9, 32, generator=torch.Generator().manual_seed(1))
    other = emb.clone()
    other[0, 6] += 1.0
    with torch.no_grad():
        a = m(inputs_embeds=emb, token_type_ids=types, attention_mask=torch.ones_like(ids)).logits[0, 3]
        b = m(inputs_embeds=other, token_type_ids=types, attention_mask=torch.ones_like(ids)).logits[0, 3]
    return float((a - b).abs().max())


def main() -> int:
    reached = {impl: reach(impl) for impl in ("eager", "sdpa")}
    print(f"transformers {transformers.__version__}: the first image position's logits move by "
          + ", ".join(f"{i} {d:.3g}" for i, d in reached.items()) + " when the last image position changes "
          "(bidirectional: > 0)")
    return int(not min(reached.values()) > 0)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # could not run: neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
