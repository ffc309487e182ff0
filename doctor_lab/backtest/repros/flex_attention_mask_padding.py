"""flex_attention broken with an attention mask for every model but Llama 4 in 4.51.0: Llama 4's
change to make_flex_block_causal_mask (#37307) pads the mask by a key length the other models never
pass, so their forward raises `pad(): argument 'pad' failed to unpack ... got NoneType`
(huggingface/transformers #37323, #37327).

Llama and Gemma, 2 layers, attn_implementation="flex_attention", a batch of 2 x 8 tokens with the
second left-padded by 2, under no_grad (flex has no CPU backward), torch.compile off (flex runs
eagerly on CPU): the forward must run and agree with eager on the real tokens.
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import os
import sys

os.environ["TORCHDYNAMO_DISABLE"] = "1"  # flex_attention runs eagerly: seconds on CPU, not a compile per shape
import torch  # noqa: E402

try:
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-4  # flex and eager sum in another order: ~1e-7


def build(arch: str, impl: str):
    cfg = AutoConfig.for_model(arch, vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).eval()


def gap(arch: str) -> float | str:
    """flex against eager on the real tokens, or the error the flex forward raised in pad()."""
    ids = torch.randint(3, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    with torch.no_grad():
        ref = build(arch, "eager")(input_ids=ids, attention_mask=mask).logits
        try:
            out = build(arch, "flex_attention")(input_ids=ids, attention_mask=mask).logits
        except TypeError as e:
            if "pad()" not in str(e):
                raise
            return f"TypeError: {str(e)[:70]}"
    return max(float((ref[0] - out[0]).abs().max()), float((ref[1, 2:] - out[1, 2:]).abs().max()))


def main() -> int:
    gaps = {arch: gap(arch) for arch in ("llama", "gemma")}
    print(f"transformers {transformers.__version__}: flex_attention with a padding mask: "
          + "; ".join(f"{a} {g if isinstance(g, str) else f'differs from eager by {g:.3g}'}" for a, g in gaps.items())
          + f" (tolerance {TOL})")
    return int(any(isinstance(g, str) or g > TOL for g in gaps.values()))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
