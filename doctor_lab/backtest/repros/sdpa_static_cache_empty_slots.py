"""Llama, Gemma and Cohere under SDPA, generating with a static cache (cache_implementation="static",
no torch.compile): with nothing padded the mask is dropped and SDPA's is_causal runs over the whole
preallocated cache, its empty slots included, so every token after the prompt is computed against
zeros it should not see (huggingface/transformers #30400; the cause, #30317, and the fix are in #30437).

Each model, random weights from a small config, greedily generates 6 tokens after a 7-token prompt
with a static cache; the logits of every step must equal those of one forward without a cache over
the generated sequence (the largest gap of the three models).
Tolerance 1e-4: the same sums in another order differ by ~1e-6; the bug moves logits by ~1e-2 to 1.
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch

try:
    import transformers
    from transformers import AutoModelForCausalLM, CohereConfig, GemmaConfig, LlamaConfig
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-4
SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2, pad_token_id=0)


def gap(cfg) -> float:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    ids = torch.randint(3, 64, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model.generate(ids, cache_implementation="static", max_new_tokens=6, min_new_tokens=6,
                             do_sample=False, output_logits=True, return_dict_in_generate=True,
                             pad_token_id=0, eos_token_id=None)
        full = model(out.sequences[:, :-1], use_cache=False).logits[0, ids.shape[1] - 1:]
    return float((torch.cat(out.logits) - full).abs().max())


def main() -> int:
    gaps = {"llama": gap(LlamaConfig(**SMALL)), "gemma": gap(GemmaConfig(head_dim=8, **SMALL)),
            "cohere": gap(CohereConfig(**SMALL))}
    print(f"transformers {transformers.__version__} (sdpa): static-cache generation differs from the full forward "
          "by " + ", ".join(f"{n} {d:.3g}" for n, d in gaps.items()) + f" (tolerance {TOL})")
    return int(max(gaps.values()) > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
