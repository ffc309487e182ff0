"""Falcon with ALiBi (alibi=True, not the default) under SDPA, called without an attention mask, gives
SDPA the ALiBi bias alone as its attn_mask, with no causal term, so every token attends to the later
ones (huggingface/transformers #29946; the SDPA port #26572 brought it, #30123 fixed it).

Falcon from a small config with alibi=True, random weights, built without naming an implementation
(SDPA from 4.36), no attention mask: the logits of the first 9 tokens must not move when the 10th
changes.
Tolerance 1e-5: the same sums in another order differ by ~1e-6; a leak moves them by ~1e-1.
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch

try:
    import transformers
    from transformers import AutoModelForCausalLM, FalconConfig
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-5


def main() -> int:
    cfg = FalconConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, alibi=True,
                       new_decoder_architecture=True, num_kv_heads=2, initializer_range=0.2, pad_token_id=0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.randint(3, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[:, -1] = (ids[:, -1] + 7) % 61 + 3
    with torch.no_grad():
        d = float((model(ids).logits[:, :-1] - model(changed).logits[:, :-1]).abs().max())
    impl = getattr(model.config, "_attn_implementation", "?")
    print(f"transformers {transformers.__version__} ({impl}, alibi): changing the last token moves the earlier logits "
          f"by {d:.3g} (tolerance {TOL})")
    return int(d > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
