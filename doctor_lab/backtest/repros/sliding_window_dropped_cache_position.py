"""The sliding window dropped from the mask when Phi3, Qwen2, Mixtral and Starcoder2 moved to
_update_causal_mask (cache positions, 4.42): the 4D mask built before carried the window, the new
one does not, so a layer reads tokens older than its window once T exceeds it
(huggingface/transformers #32945, on Phi3; fixed by #33586 and its siblings in 4.46).

Per architecture: one layer, window 4, 12 tokens, eager and SDPA where the release has it: the last
position's logits must not move when token 0, outside the window, is replaced.
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


ARCHS = {"phi3": {"original_max_position_embeddings": 64},
         "qwen2": {"use_sliding_window": True, "max_window_layers": 0},  # every layer slides
         "mixtral": {"num_local_experts": 2},
         "starcoder2": {}}


def leak(arch: str, impl: str) -> tuple[str, float] | None:
    """The implementation the model runs, how far its last logits move; None where the release has no
    such implementation (from_config may also fall back to eager: the name says what ran)."""
    cfg = AutoConfig.for_model(arch, vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=4, num_key_value_heads=2, sliding_window=4,
                               max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                               **ARCHS[arch])
    cfg._attn_implementation = impl
    torch.manual_seed(0)
    try:
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).eval()
    except ValueError as e:
        if "does not support" in str(e) and impl != "eager":
            return None
        raise
    ids = torch.randint(3, 64, (1, 12), generator=torch.Generator().manual_seed(1))
    other = ids.clone()
    other[0, 0] = 3 + (ids[0, 0] - 3 + 1) % 61
    with torch.no_grad():
        a = model(ids, use_cache=False).logits[0, -1]
        b = model(other, use_cache=False).logits[0, -1]
    return model.config._attn_implementation, float((a - b).abs().max())


def main() -> int:
    runs = [(*r, a) for a in ARCHS for i in ("eager", "sdpa") if (r := leak(a, i))]
    leaks = {f"{a} {impl}": d for impl, d, a in runs}
    print(f"transformers {transformers.__version__}: last logits move by "
          + ", ".join(f"{k} {d:.2g}" for k, d in leaks.items()) + f" when a token outside the window changes "
          f"(tolerance {TOL})")
    return int(max(leaks.values()) > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
