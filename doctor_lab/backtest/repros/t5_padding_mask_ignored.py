"""T5 in 4.49 generates differently from a right-padded input: while decoding with the cache, the
encoder's padding is no longer masked, so the pads after a short input change what is generated from
it (huggingface/transformers #36293).

A 5-token input alone and right-padded to 13 (mask 0 on the pads): greedy generate() of 6 tokens must
give the same logits at every step.
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch

try:
    import transformers
    from transformers import T5Config, T5ForConditionalGeneration
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-4  # the same sums in another order differ by ~1e-6


def main() -> int:
    cfg = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                   relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(cfg).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 64, (1, 5), generator=g)
    padded = torch.cat([ids, torch.randint(2, 64, (1, 8), generator=g)], 1)  # what the pads hold must not matter
    mask = torch.cat([torch.ones(1, 5, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long)], 1)
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        a = torch.stack(model.generate(ids, attention_mask=torch.ones_like(ids), **kw).logits)
        b = torch.stack(model.generate(padded, attention_mask=mask, **kw).logits)
    d = float((a - b).abs().max())
    print(f"transformers {transformers.__version__} ({model.config._attn_implementation}): masked padding moves "
          f"the generated logits by {d:.3g} (tolerance {TOL})")
    return int(d > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
