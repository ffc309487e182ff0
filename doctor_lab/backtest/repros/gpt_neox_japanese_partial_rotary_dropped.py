"""GPT-NeoX-Japanese with rotary_pct below 1 (not the default): its attention rotates only
rotary_pct of each head, but the rotary embedding, re-based on Llama's (#39847), builds its
frequencies over the whole head, so the first forward raises on the size mismatch
(huggingface/transformers #48630; fixed by #48652).

GPT-NeoX-Japanese from a small config with rotary_pct 0.5, random weights: a forward over a batch
must run; one that raises the rotary size mismatch is the bug.
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch

try:
    import transformers
    from transformers import GPTNeoXJapaneseConfig, GPTNeoXJapaneseForCausalLM
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)


def main() -> int:
    cfg = GPTNeoXJapaneseConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_multiple_size=2, max_position_embeddings=128, rotary_pct=0.5,
                                initializer_range=0.2)
    torch.manual_seed(0)
    model = GPTNeoXJapaneseForCausalLM(cfg).eval()
    ids = torch.randint(3, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        try:
            logits = model(ids).logits
        except RuntimeError as e:
            if "must match the size" not in str(e):
                raise
            print(f"transformers {transformers.__version__} (rotary_pct 0.5): the forward raised: {str(e)[:120]}")
            return 1
    print(f"transformers {transformers.__version__} (rotary_pct 0.5): the forward runs, logits {tuple(logits.shape)}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
