"""SDPA models asked for output_attentions fall back to the eager attention, but the causal mask was
skipped for SDPA (no padding: SDPA would apply is_causal itself), so the eager fallback runs with no
mask at all and every position sees the future (huggingface/transformers #30652).

Per architecture, 2 layers, SDPA, 8 tokens, output_attentions=True: replacing the last token must
leave the earlier positions' logits unchanged.
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch

try:
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-6  # a masked key contributes exactly 0
ARCHS = ("llama", "gemma", "cohere")  # and OLMo, new in 4.40.0; Mistral, Qwen2, Starcoder2, Phi were not touched


def leak(arch: str) -> float:
    cfg = AutoConfig.for_model(arch, vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    ids = torch.randint(3, 64, (1, 8), generator=torch.Generator().manual_seed(1))
    other = ids.clone()
    other[0, -1] = 3 + (ids[0, -1] - 3 + 1) % 61
    with torch.no_grad():
        a = model(input_ids=ids, output_attentions=True).logits[0, :-1]
        b = model(input_ids=other, output_attentions=True).logits[0, :-1]
    return float((a - b).abs().max())


def main() -> int:
    leaks = {arch: leak(arch) for arch in ARCHS}
    print(f"transformers {transformers.__version__}: with output_attentions, earlier logits move by "
          + ", ".join(f"{a} {d:.2g}" for a, d in leaks.items()) + f" when the last token changes (tolerance {TOL})")
    return int(max(leaks.values()) > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
