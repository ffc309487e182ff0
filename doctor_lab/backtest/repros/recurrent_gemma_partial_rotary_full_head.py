"""RecurrentGemma rotates half of each attention head (partial_rotary_factor 0.5, its default); its
apply_rotary_pos_emb rotates as many channels as the rotary embedding's cos is wide. When the rotary
embedding was made a copy of Llama's (which has no partial rotary), cos came out as wide as the whole
head, so every channel turns with the position and the model silently attends as it was not trained
to (huggingface/transformers #48477; GPT-NeoX-Japanese lost its partial rotary the same way, #48630).

RecurrentGemma from a small config (head size 8), random weights: the cos its rotary embedding gives
for a batch of positions must be int(8 * 0.5) = 4 channels wide.
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch

try:
    import transformers
    from transformers import RecurrentGemmaConfig, RecurrentGemmaForCausalLM
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

HEAD, FACTOR = 8, 0.5


def main() -> int:
    cfg = RecurrentGemmaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                               num_attention_heads=4, num_key_value_heads=1, lru_width=32, attention_window_size=16,
                               partial_rotary_factor=FACTOR, initializer_range=0.2)
    torch.manual_seed(0)
    model = RecurrentGemmaForCausalLM(cfg).eval()
    ropes = [m for name, m in model.named_modules() if name.endswith("rotary_emb")]
    if not ropes:
        print("could not run: no rotary_emb module")
        return 2
    x = torch.zeros(2, 10, HEAD)
    positions = torch.arange(10).expand(2, -1)
    with torch.no_grad():
        cos, _ = ropes[0](x, positions)
    width = cos.shape[-1]
    print(f"transformers {transformers.__version__}: RecurrentGemma rotates {width} of {HEAD} channels per head "
          f"(partial_rotary_factor {FACTOR}: {int(HEAD * FACTOR)})")
    return int(width != int(HEAD * FACTOR))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
