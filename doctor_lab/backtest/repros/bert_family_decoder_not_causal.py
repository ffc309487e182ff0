"""RoFormer, BigBird, RemBert and MegatronBert as causal decoders (is_decoder=True) attend to future
tokens since 5.9.0: their models build a bidirectional mask whatever the config says, so each
position sees the tokens after it (huggingface/transformers #48745; fixed by #48760).

Per architecture, 2 layers, is_decoder=True, 8 tokens: replacing the last token must leave the earlier
positions' logits unchanged.
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
ARCHS = {"roformer": {"embedding_size": 32}, "big_bird": {"attention_type": "original_full"},
         "rembert": {"input_embedding_size": 32, "output_embedding_size": 32}, "megatron-bert": {}}


def leak(arch: str) -> float:
    cfg = AutoConfig.for_model(arch, vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, max_position_embeddings=64, is_decoder=True, **ARCHS[arch])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.randint(3, 64, (1, 8), generator=torch.Generator().manual_seed(1))
    other = ids.clone()
    other[0, -1] = 3 + (ids[0, -1] - 3 + 1) % 61
    with torch.no_grad():
        a = model(input_ids=ids).logits[0, :-1]
        b = model(input_ids=other).logits[0, :-1]
    return float((a - b).abs().max())


def main() -> int:
    leaks = {arch: leak(arch) for arch in ARCHS}
    print(f"transformers {transformers.__version__}: earlier logits move by "
          + ", ".join(f"{a} {d:.3g}" for a, d in leaks.items()) + f" when the last token changes (tolerance {TOL})")
    return int(max(leaks.values()) > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
