"""PaliGemma in training (token_type_ids and labels given) unmasks its whole prefix after applying the
padding mask, so left-padding tokens (token type 0, like the prefix) become visible again
(huggingface/transformers #35855; fixed by #35859, which applies the padding mask last).

An image (4 tokens), a 3-token prefix, a 3-token suffix; the same row left-padded by 3, labels given:
the real tokens' logits must not move (positions are rotary, so the shift alone changes nothing).
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch

try:
    import transformers
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-4  # the same sums in another order differ by ~1e-7
IMAGE = 63  # the image token
PAD = 0


def model():
    cfg = PaliGemmaConfig(
        vision_config={"model_type": "siglip_vision_model", "hidden_size": 16, "intermediate_size": 32,
                       "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 8, "patch_size": 4},
        text_config={"model_type": "gemma", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                     "pad_token_id": PAD},
        image_token_index=IMAGE, vocab_size=64, projection_dim=32, hidden_size=32, pad_token_id=PAD)
    cfg.text_config._attn_implementation = "eager"
    torch.manual_seed(0)
    return PaliGemmaForConditionalGeneration(cfg).eval()


def main() -> int:
    m = model()
    g = torch.Generator().manual_seed(1)
    text = torch.randint(3, 60, (1, 6), generator=g)
    ids = torch.cat([torch.full((1, 4), IMAGE), text], 1)
    types = torch.tensor([[0] * 7 + [1] * 3])
    labels = torch.where(types == 1, ids, torch.full_like(ids, -100))
    pixels = torch.randn(1, 3, 8, 8, generator=g)
    P = 3
    pad = lambda x, v: torch.cat([torch.full((1, P), v, dtype=x.dtype), x], 1)  # noqa: E731
    with torch.no_grad():
        a = m(input_ids=ids, pixel_values=pixels, attention_mask=torch.ones_like(ids), token_type_ids=types,
              labels=labels).logits[0]
        b = m(input_ids=pad(ids, PAD), pixel_values=pixels, attention_mask=pad(torch.ones_like(ids), 0),
              token_type_ids=pad(types, 0), labels=pad(labels, -100)).logits[0, P:]
    d = float((a - b).abs().max())
    print(f"transformers {transformers.__version__}: left padding moves the real tokens' logits by {d:.3g} "
          f"in training (tolerance {TOL})")
    return int(d > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
