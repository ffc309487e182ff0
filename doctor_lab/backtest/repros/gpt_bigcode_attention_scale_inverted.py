"""GPT-BigCode multiplies its attention scores by sqrt(head_dim) instead of dividing by it
(huggingface/transformers #40041): the move to the attention interface set
self.scaling = head_dim ** 0.5.

A tiny GPT-BigCode (multi-query, random weights, eager, output_attentions): layer 0's attention
probabilities must equal softmax(q k^T / sqrt(head_dim)) under the causal mask, computed here from
the layer's own projection of its input. Exit 1: the bug is present; 0: it is not; 2: the repro could
not run."""
import sys

import torch

try:
    import transformers
    from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM
except ImportError as e:
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-4
HEADS, DIM = 4, 32


def main() -> int:
    torch.manual_seed(0)
    cfg = GPTBigCodeConfig(vocab_size=64, n_embd=DIM, n_layer=1, n_head=HEADS, n_positions=64, multi_query=True)
    cfg._attn_implementation = "eager"
    model = GPTBigCodeForCausalLM(cfg).eval()
    attn = model.transformer.h[0].attn
    seen = {}

    def grab(module, args, kwargs):
        seen["h"] = args[0] if args else kwargs["hidden_states"]
    attn.register_forward_pre_hook(grab, with_kwargs=True)
    ids = torch.randint(0, 64, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(ids, output_attentions=True)
        h = seen["h"]
        b, t, _ = h.shape
        d = DIM // HEADS
        qkv = attn.c_attn(h)
        q = qkv[..., :DIM].view(b, t, HEADS, d).transpose(1, 2)
        k = qkv[..., DIM:DIM + d].view(b, 1, t, d)
        scores = q @ k.transpose(-1, -2) * d ** -0.5
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        want = scores.softmax(-1)
    got = out.attentions[0].reshape(want.shape)
    diff = float((got - want).abs().max())
    print(f"transformers {transformers.__version__}: GPT-BigCode layer 0 attention probabilities differ from "
          f"softmax(q k^T / sqrt(d)) by {diff:.3g} (tolerance {TOL})")
    return int(diff > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
