"""flex_attention generating through a static cache raises while building its block mask
(huggingface/transformers #46682, #46757): the static cache's get_seq_length() returns a tensor
(StaticLayer.cumulative_length), which became the mask's q_offset, and `q_idx + q_offset` as a tensor
gives the mask function's result an extra dimension, so create_block_mask cannot unpack it.

A tiny Llama (random weights), generate(cache_implementation="static") under flex_attention (run
eagerly: torch.compile off, as on CPU it must be) against the same under eager: the same greedy tokens.
Exit 1: the bug is present (flex raises ValueError building the mask, or its tokens differ); 0: it is
not; 2: the repro could not run."""
import os
import sys

os.environ["TORCHDYNAMO_DISABLE"] = "1"  # flex_attention runs eagerly: seconds on CPU, not a compile per shape

import torch  # noqa: E402

try:
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as e:
    print(f"could not run: {e}")
    sys.exit(2)


def tokens(impl: str) -> list:
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation=impl).eval()
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, do_sample=False, cache_implementation="static", pad_token_id=0)
    return out[0, 6:].tolist()


def main() -> int:
    want = tokens("eager")
    try:
        got = tokens("flex_attention")
    except ValueError as e:   # the bug: the block mask of a tensor q_offset has an extra dimension
        print(f"transformers {transformers.__version__}: flex_attention with a static cache raised ValueError: "
              f"{' '.join(str(e).split())[:120]}")
        return 1
    print(f"transformers {transformers.__version__}: static-cache greedy tokens, flex {got} / eager {want}")
    return int(got != want)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything else raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
