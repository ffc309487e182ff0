"""RecurrentGemma saved and reloaded with transformers 5.0 comes back with other rotary frequencies:
5.0's from_pretrained re-makes the non-persistent buffers on load and restores the rotary inv_freq
after, and RecurrentGemma's comes back unlike the one the model was built with, so the reloaded
model attends differently from the saved one (the mechanism unslothai/unsloth #4112 describes for
v5's loading).

A small RecurrentGemma with random weights (its default partial_rotary_factor 0.5), saved with
save_pretrained into a fresh directory and loaded back with from_pretrained: its rotary inv_freq
and its logits over 10 tokens (eager) must equal the saved model's.
Tolerance 1e-5: the same weights and the same computation agree exactly.
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import os
import sys

import torch

try:
    import transformers
    from transformers import RecurrentGemmaConfig, RecurrentGemmaForCausalLM
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-5


def fresh_dir() -> str:
    d = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"recurrent_gemma_reload_{os.getpid()}")
    os.makedirs(d, exist_ok=False)
    return d


def remove(d: str) -> None:
    for name in os.listdir(d):
        os.remove(os.path.join(d, name))
    os.rmdir(d)


def inv_freqs(model) -> list:
    return [b for name, b in model.named_buffers() if name.endswith("inv_freq")]


def main() -> int:
    cfg = RecurrentGemmaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                               num_attention_heads=4, num_key_value_heads=1, lru_width=32, attention_window_size=16,
                               initializer_range=0.2)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = RecurrentGemmaForCausalLM(cfg).eval()
    ids = torch.randint(3, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    d = fresh_dir()
    try:
        model.save_pretrained(d)
        reloaded = RecurrentGemmaForCausalLM.from_pretrained(d, attn_implementation="eager").eval()
    finally:
        remove(d)
    freq = max((float((a - b).abs().max()) if a.shape == b.shape else float("inf"))
               for a, b in zip(inv_freqs(model), inv_freqs(reloaded)))
    with torch.no_grad():
        d_logits = float((model(ids).logits - reloaded(ids).logits).abs().max())
    print(f"transformers {transformers.__version__}: after save/load RecurrentGemma's rotary inv_freq moves by "
          f"{freq:.3g} and its logits by {d_logits:.3g} (tolerance {TOL})")
    return int(max(freq, d_logits) > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
