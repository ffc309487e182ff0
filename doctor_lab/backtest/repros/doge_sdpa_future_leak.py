"""Doge under SDPA attends to future tokens: with no padding the causal mask is skipped (SDPA is to
apply causality with is_causal), but Doge's attention builds its own dynamic mask, so SDPA gets a
mask that is not causal and no is_causal (huggingface/transformers #48748).

2 layers, SDPA, 8 tokens, no attention mask: replacing the last token must leave the earlier
positions' logits unchanged.
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch
try:
    import transformers
    from transformers import DogeConfig, DogeForCausalLM
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-6  # a masked key contributes exactly 0


def main() -> int:
    cfg = DogeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, keep_window_size=64,
                     is_moe=False)
    torch.manual_seed(0)
    model = DogeForCausalLM._from_config(cfg, attn_implementation="sdpa").eval()
    ids = torch.randint(3, 64, (1, 8), generator=torch.Generator().manual_seed(1))
    other = ids.clone()
    other[0, -1] = 3 + (ids[0, -1] - 3 + 1) % 61
    with torch.no_grad():
        a = model(input_ids=ids).logits[0, :-1]
        b = model(input_ids=other).logits[0, :-1]
    d = float((a - b).abs().max())
    print(f"transformers {transformers.__version__} ({model.config._attn_implementation}): earlier logits move by "
          f"{d:.3g} when the last token changes (tolerance {TOL})")
    return int(d > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # could not run: neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
