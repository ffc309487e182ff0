"""Persimmon (Fuyu's text model) under SDPA in transformers 5.0 to 5.16: its own causal mask, built
when no attention_mask is passed, is past_seen_tokens + sequence_length + 1 columns wide, one more
than there are keys; sdpa_attention_forward used to slice the mask to the keys' length and #41900
(5.0.0) removed that slice, so a cached step of several tokens raises
(huggingface/transformers #41900).

Persimmon from a small config, random weights, SDPA, no attention mask: a prefill of 6 tokens, then
a cached step of 3, whose logits must equal those of one forward over the 9 tokens. A step that
raises the mask's size mismatch is the bug.
Tolerance 1e-4: the same sums in another order differ by ~1e-6.
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch

try:
    import transformers
    from transformers import AutoModelForCausalLM, PersimmonConfig
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-4


def main() -> int:
    cfg = PersimmonConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, max_position_embeddings=128, initializer_range=0.2, pad_token_id=0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    ids = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        past = model(ids[:, :6], use_cache=True).past_key_values
        try:
            step = model(ids[:, 6:], past_key_values=past, use_cache=True).logits
        except RuntimeError as e:
            if "must match the size" not in str(e):
                raise
            print(f"transformers {transformers.__version__} (sdpa): the cached 3-token step raised: {str(e)[:120]}")
            return 1
    d = float((step - full[:, 6:]).abs().max())
    print(f"transformers {transformers.__version__} (sdpa): the cached 3-token step differs from the full forward by "
          f"{d:.3g} (tolerance {TOL})")
    return int(d > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
