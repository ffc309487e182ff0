"""OPT scales its queries by head_dim ** -0.5 and then the attention scales the scores again
(huggingface/transformers #38277, #38290): the attention refactor passed no scaling to the attention
function, which applies its default 1/sqrt(head_dim) to queries already scaled.

A tiny OPT (random weights, eager, output_attentions): layer 0's attention probabilities must equal
softmax(q k^T / sqrt(head_dim)) under the causal mask, computed here from the layer's own projections
of its input. Exit 1: the bug is present; 0: it is not; 2: the repro could not run."""
import sys

import torch

try:
    import transformers
    from transformers import OPTConfig, OPTForCausalLM
except ImportError as e:
    print(f"could not run: {e}")
    sys.exit(2)

TOL = 1e-4
HEADS = 4


def main() -> int:
    torch.manual_seed(0)
    cfg = OPTConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, ffn_dim=64, num_attention_heads=HEADS,
                    max_position_embeddings=64, word_embed_proj_dim=32)
    cfg._attn_implementation = "eager"
    model = OPTForCausalLM(cfg).eval()
    # stronger projections, so that a second 1/sqrt(d) visibly flattens the softmax
    attn = model.model.decoder.layers[0].self_attn
    for lin in (attn.q_proj, attn.k_proj):
        lin.weight.data *= 8
    seen = {}

    def grab(module, args, kwargs):
        seen["h"] = args[0] if args else kwargs["hidden_states"]
    attn.register_forward_pre_hook(grab, with_kwargs=True)
    ids = torch.randint(0, 64, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(ids, output_attentions=True)
        h = seen["h"]
        b, t, _ = h.shape
        d = 32 // HEADS
        q = attn.q_proj(h).view(b, t, HEADS, d).transpose(1, 2)
        k = attn.k_proj(h).view(b, t, HEADS, d).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) * d ** -0.5
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        want = scores.softmax(-1)
    got = out.attentions[0]
    diff = float((got - want).abs().max())
    print(f"transformers {transformers.__version__}: OPT layer 0 attention probabilities differ from "
          f"softmax(q k^T / sqrt(d)) by {diff:.3g} (tolerance {TOL})")
    return int(diff > TOL)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 -- anything raised means the repro could not run: exit 2, neither present nor absent
        print(f"could not run: {type(e).__name__}: {e}")
        sys.exit(2)
