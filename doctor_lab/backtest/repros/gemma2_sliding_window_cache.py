"""Gemma2 decoding past its sliding window with the cache generate() makes (HybridCache): the attention
refactor (huggingface/transformers #35235) stopped passing the layer's sliding window to the cache
update, so a sliding layer writes past its window-sized cache: IndexError on CPU, a device-side
assert on CUDA (fixed by #35681, with "a logic issue in the masking and slicing").

Window 4, a prompt of 8, greedy generate() of 4 tokens with their logits: each step's logits must
equal one full forward over the final sequence (eager).
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch

try:
    import transformers
    from transformers import Gemma2Config, Gemma2ForCausalLM
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-4  # the same sums in another order differ by ~1e-7


def main() -> int:
    cfg = Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
                       query_pre_attn_scalar=8, max_position_embeddings=64, pad_token_id=0, eos_token_id=1,
                       bos_token_id=2)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(cfg).eval()
    prompt = torch.randint(3, 64, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        try:
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4,
                                 min_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True)
        except IndexError as e:  # the sliding layer's write past its cache
            print(f"transformers {transformers.__version__}: decoding past the window raises IndexError: {e}")
            return 1
        steps = torch.stack(out.logits, 1)[0]
        full = model(out.sequences, use_cache=False).logits[0, 7:-1]
    d = float((steps - full).abs().max())
    print(f"transformers {transformers.__version__}: decoded logits differ from the full forward by {d:.3g} "
          f"(tolerance {TOL})")
    return int(d > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
