"""Qwen2's sliding window dropped from the eager and SDPA mask by the attention refactor of 4.48
(huggingface/transformers #35924, #35235): the mask no longer carries the window, which is passed to
flash attention only, so a sliding layer reads tokens older than its window once T exceeds it.

One layer with use_sliding_window (max_window_layers=0: every layer slides), window 4, 12 tokens, eager
and SDPA: the last position's logits must not move when token 0, outside the window, is replaced.
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch

try:
    import transformers
    from transformers import Qwen2Config, Qwen2ForCausalLM
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-6  # a masked key contributes exactly 0


def measure(impl: str) -> float:
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=4,
                      max_window_layers=0, max_position_embeddings=64)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM._from_config(cfg, attn_implementation=impl).eval()
    ids = torch.randint(3, 64, (1, 12), generator=torch.Generator().manual_seed(1))
    other = ids.clone()
    other[0, 0] = 3 + (ids[0, 0] - 3 + 1) % 61
    with torch.no_grad():
        a = model(ids, use_cache=False).logits[0, -1]
        b = model(other, use_cache=False).logits[0, -1]
    return float((a - b).abs().max())


def main() -> int:
    leaks = {impl: measure(impl) for impl in ("eager", "sdpa")}
    print(f"transformers {transformers.__version__}: last logits move by "
          + ", ".join(f"{i} {d:.3g}" for i, d in leaks.items()) + f" when a token outside the window changes "
          f"(tolerance {TOL})")
    return int(max(leaks.values()) > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
