"""Llama with dynamic NTK RoPE scaling keeps the scaled frequencies for a short input after a long one
(huggingface/transformers #46624): dynamic_frequency_update, on the path without layer types, reads
max_seq_len_cached but writes None_max_seq_len_cached, so the reset to the original frequencies
never runs.

A tiny Llama (random weights) with rope scaling `dynamic` (factor 2) over max_position_embeddings 16:
the logits of a 6-token input must be the same before and after a 40-token forward.
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch

try:
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as e:
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-6


def build():
    kw = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=4, max_position_embeddings=16)
    cfg = LlamaConfig(**kw, rope_scaling={"type": "dynamic", "factor": 2.0})
    model = LlamaForCausalLM(cfg).eval()
    rope = model.model.rotary_emb if hasattr(model.model, "rotary_emb") else model.model.layers[0].self_attn.rotary_emb
    kind = getattr(rope, "rope_type", None) or type(rope).__name__
    if "dynamic" not in str(kind).lower():
        raise RuntimeError(f"the rotary embedding is not dynamic here: {kind}")
    return model


def main() -> int:
    torch.manual_seed(0)
    model = build()
    g = torch.Generator().manual_seed(1)
    short, long = torch.randint(0, 64, (1, 6), generator=g), torch.randint(0, 64, (1, 40), generator=g)
    with torch.no_grad():
        first = model(short).logits
        model(long)
        again = model(short).logits
    diff = float((first - again).abs().max())
    print(f"transformers {transformers.__version__}: short input's logits after a long one moved by {diff:.3g}"
          f" (tolerance {TOL})")
    return int(diff > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
