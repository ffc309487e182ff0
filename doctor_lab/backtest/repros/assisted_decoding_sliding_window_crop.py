"""Assisted (speculative) decoding of a model with sliding-window layers, once its sequence passes the
window, must give the plain greedy generate()'s tokens (huggingface/transformers #46629, #47153): from
5.12.0 generate() passed the config to the cache in the full-cache mode assisted decoding forces
(#46600), so sliding-window models built DynamicSlidingWindowLayers there, and the roll-back of
rejected draft tokens (crop) raises once a layer has seen more tokens than its window.

A tiny Mistral (random weights, eager, sliding_window 4, so that the prompt of 6 and 12 new tokens
pass it), its own copy as the assistant. Exit 1: the bug is present (assisted generate raises or
gives other tokens); 0: it is not; 2: the repro could not run."""
import sys

import torch

try:
    import transformers
    from transformers import MistralConfig, MistralForCausalLM
except ImportError as e:
    print(f"could not run: {e}")
    sys.exit(2)


def main() -> int:
    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=4, max_position_embeddings=64)
    cfg._attn_implementation = "eager"
    model = MistralForCausalLM(cfg).eval()
    assistant = MistralForCausalLM(cfg).eval()
    assistant.load_state_dict(model.state_dict())   # its own copy
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        plain = model.generate(ids, **kw)
        try:
            assisted = model.generate(ids, assistant_model=assistant, **kw)
        except (RuntimeError, IndexError, ValueError) as e:   # the bug, where it raises
            print(f"transformers {transformers.__version__}: assisted generate raised {type(e).__name__}: "
                  f"{' '.join(str(e).split())[:160]}")
            return 1
    same = plain.shape == assisted.shape and bool((plain == assisted).all())
    print(f"transformers {transformers.__version__}: assisted greedy tokens {'equal' if same else 'differ from'} "
          f"plain greedy ones ({plain[0, 6:].tolist()} / {assisted[0, 6:].tolist()})")
    return int(not same)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything else raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
