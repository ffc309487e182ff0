"""GPT-NeoX and GPT-2 under SDPA (their default from 4.42) with a KV cache and no attention mask:
several new tokens after the cache get SDPA's causal mask aligned to the top left, so they miss
keys they should see (huggingface/transformers #31943; fixed by #31944).

Prefill 8 tokens, then 3 more in one call, no mask, the default attention implementation: the 3
tokens' logits must equal those of one forward over the 11 tokens (the larger gap of the two).
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch

try:
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, GPTNeoXConfig, GPTNeoXForCausalLM
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-4  # the same sums in another order differ by ~1e-7


def gap(model) -> float:
    ids = torch.randint(0, 64, (1, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids).logits[0, 8:]
        past = model(ids[:, :8], use_cache=True).past_key_values
        new = model(ids[:, 8:], past_key_values=past, use_cache=True).logits[0]
    return float((full - new).abs().max())


def main() -> int:
    torch.manual_seed(0)
    models = {"gpt_neox": GPTNeoXForCausalLM(GPTNeoXConfig(
                  vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=64)),
              "gpt2": GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64))}
    gaps = {name: gap(m.eval()) for name, m in models.items()}
    impl = models["gpt2"].config._attn_implementation
    print(f"transformers {transformers.__version__} ({impl}): 3 tokens after the cache differ from the full "
          f"forward by " + ", ".join(f"{n} {d:.3g}" for n, d in gaps.items()) + f" (tolerance {TOL})")
    return int(max(gaps.values()) > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
