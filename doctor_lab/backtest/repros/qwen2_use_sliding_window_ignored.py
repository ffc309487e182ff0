"""Qwen2 (and Qwen3) configured with use_sliding_window=False still get their sliding_window in the
causal mask: the mask builder reads config.sliding_window without looking at use_sliding_window, so
a checkpoint that ships a window it does not use (DeepSeek-R1-Distill-Qwen: sliding_window 4096,
use_sliding_window false) attends to the last window only once the sequence is longer
(huggingface/transformers #38002; fixed by #38045).

Builds each model twice from one small config with random weights (2 layers, max_window_layers=0,
so use_sliding_window is the only thing that turns the window off): once with sliding_window=4 and
use_sliding_window=False, once with sliding_window=None, the second loading the first's weights.
Compares their logits over 12 tokens (longer than the window), under eager and SDPA: a window that
is switched off must change nothing. Tolerance 1e-5: both run the same computation under the same
mask, so they agree exactly (measured 0); the applied window moves them by 0.13 (Qwen2) and 0.29 (Qwen3).
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch

try:
    import transformers
    from transformers import Qwen2Config, Qwen2ForCausalLM
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-5
T, WINDOW = 12, 4


def models():
    """(name, config class, model class) of the models that exist in this release (Qwen3 from 4.51)."""
    out = [("qwen2", Qwen2Config, Qwen2ForCausalLM)]
    if hasattr(transformers, "Qwen3ForCausalLM"):
        out.append(("qwen3", transformers.Qwen3Config, transformers.Qwen3ForCausalLM))
    return out


def gap(config_cls, model_cls, impl: str) -> float:
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, max_window_layers=0, use_sliding_window=False)
    logits = []
    state = None
    for window in (WINDOW, None):
        cfg = config_cls(**base, sliding_window=window)
        cfg._attn_implementation = impl
        torch.manual_seed(0)
        model = model_cls(cfg).eval()
        if state is None:
            state = model.state_dict()
        else:
            model.load_state_dict(state)
        ids = torch.randint(0, 64, (1, T), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            logits.append(model(ids).logits)
    return float((logits[0] - logits[1]).abs().max())


def main() -> int:
    gaps = {f"{name}/{impl}": gap(c, m, impl) for name, c, m in models() for impl in ("eager", "sdpa")}
    print(f"transformers {transformers.__version__}: use_sliding_window=False with sliding_window={WINDOW} against "
          f"no window, {T} tokens: " + ", ".join(f"{k} {v:.3g}" for k, v in gaps.items()) + f" (tolerance {TOL})")
    return int(max(gaps.values()) > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
