"""GPT-2 under SDPA (its default from 4.42) ignores scale_attn_by_inverse_layer_idx and
scale_attn_weights: the eager path divides layer i's scores by i + 1 (and by sqrt(head_dim) only if
scale_attn_weights), the SDPA call gets no scale and always uses 1/sqrt(head_dim). A config with the
Mistral GPT-2 stability flags (#13573) computes other attention by default than in eager
(huggingface/transformers #44380; fixed by #44397, which passes the module's scaling to the
attention interface).

Builds a small GPT-2 with random weights twice from one config, eager and the release's default
implementation (SDPA from 4.42; eager before, where GPT-2 has no SDPA), the second loading the
first's weights, its q/k/v projection scaled 4x so that the scale matters, for each of
scale_attn_by_inverse_layer_idx=True and scale_attn_weights=False, and compares their logits over 12
tokens (the larger gap). Tolerance 1e-4: the same attention by two kernels differs by float32
rounding (measured 1e-7); the dropped scales move the logits by 0.02 (inverse layer index) and 0.07 (unscaled).
Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch

try:
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError as e:  # a release without these: the repro cannot run there
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-4
FLAGS = {"inverse_layer_idx": {"scale_attn_by_inverse_layer_idx": True}, "unscaled": {"scale_attn_weights": False}}


def gap(flags: dict) -> tuple[float, str]:
    kw = dict(vocab_size=64, n_embd=32, n_layer=3, n_head=4, n_positions=64, **flags)
    cfg = GPT2Config(**kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    eager = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for block in eager.transformer.h:
            block.attn.c_attn.weight.mul_(4.0)
    default = GPT2LMHeadModel(GPT2Config(**kw)).eval()  # the release's default attention implementation
    default.load_state_dict(eager.state_dict())
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        d = float((eager(ids).logits - default(ids).logits).abs().max())
    return d, default.config._attn_implementation


def main() -> int:
    gaps = {name: gap(flags) for name, flags in FLAGS.items()}
    impl = next(iter(gaps.values()))[1]
    print(f"transformers {transformers.__version__}: default ({impl}) against eager: "
          + ", ".join(f"{n} {d:.3g}" for n, (d, _) in gaps.items()) + f" (tolerance {TOL})")
    return int(max(d for d, _ in gaps.values()) > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
