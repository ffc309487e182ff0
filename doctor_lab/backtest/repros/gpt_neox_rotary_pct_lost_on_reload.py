"""GPT-NeoX saved and reloaded in transformers 5 loses its rotary_pct: the v5 config keeps it as
rope_parameters["partial_rotary_factor"], and on reload GPTNeoXConfig overwrites that with
kwargs.pop("rotary_pct", 0.25), the default, since rotary_pct is no longer a key of config.json. A
model whose rotary_pct is not 0.25 comes back rotating another share of each head, with another
frequency ladder (huggingface/transformers #44913; fixed by #44985, which also fixes
GPTNeoXJapanese's copy of the same line).

Builds a small GPT-NeoX with random weights and rotary_pct=0.5 (its q/k/v projection scaled 8x, so
that positions move the scores), saves it with save_pretrained into a fresh directory, loads it back
with from_pretrained and compares the two models' logits over 16 tokens (eager). Tolerance 1e-5:
the same weights and the same computation agree exactly (measured 0); the reset rotary_pct moves
the logits by 0.17 here.
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import os
import sys

import torch

try:
    import transformers
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-5
ROTARY_PCT = 0.5


def fresh_dir() -> str:
    root = os.environ.get("TMPDIR", "/tmp")
    d = os.path.join(root, f"gpt_neox_rotary_pct_{os.getpid()}")
    os.makedirs(d, exist_ok=False)
    return d


def remove(d: str) -> None:
    for name in os.listdir(d):
        os.remove(os.path.join(d, name))
    os.rmdir(d)


def partial_factor(config) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    return rope.get("partial_rotary_factor", getattr(config, "rotary_pct", None))


def main() -> int:
    cfg = GPTNeoXConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        max_position_embeddings=64, rotary_pct=ROTARY_PCT)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(cfg).eval()
    with torch.no_grad():  # q and k 8x the init's, so that positions (hence the rotation) move the scores
        for layer in model.gpt_neox.layers:
            layer.attention.query_key_value.weight.mul_(8.0)
    d = fresh_dir()
    try:
        model.save_pretrained(d)
        reloaded = GPTNeoXForCausalLM.from_pretrained(d, attn_implementation="eager").eval()
    finally:
        remove(d)
    ids = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        gap = float((model(ids).logits - reloaded(ids).logits).abs().max())
    print(f"transformers {transformers.__version__}: rotary_pct {ROTARY_PCT} saved, {partial_factor(reloaded.config)} "
          f"reloaded; logits differ by {gap:.3g} (tolerance {TOL})")
    return int(gap > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
