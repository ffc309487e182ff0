"""Gemma2 built without naming an attention implementation runs SDPA, which never applies the attention
logit softcapping the eager path applies from 4.42.3 on: the model's default path disagrees with eager
(huggingface/transformers #32848; 4.45 made eager Gemma2's default, #32865).

Gemma2 from a small config (its default attn_logit_softcapping 50), random weights, built twice with the
same seed: once with no attn_implementation (what from_config picks), once with "eager". Their logits on
the same batch must agree.
Tolerance 1e-4: the same sums in another order differ by ~1e-6; the missing softcap moves them by ~5e-3.
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch

try:
    import transformers
    from transformers import AutoModelForCausalLM, Gemma2Config
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-4


def build(**kw):
    cfg = Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, max_position_embeddings=128, initializer_range=0.2,
                       pad_token_id=0, sliding_window=64, query_pre_attn_scalar=8)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, **kw).eval()


def main() -> int:
    default, eager = build(), build(attn_implementation="eager")
    ids = torch.randint(3, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        d = float((default(ids).logits - eager(ids).logits).abs().max())
    print(f"transformers {transformers.__version__}: Gemma2's default path ({default.config._attn_implementation}) "
          f"differs from eager by {d:.3g} (tolerance {TOL})")
    return int(d > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
