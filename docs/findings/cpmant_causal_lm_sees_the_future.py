"""CpmAntForCausalLM's logits at a position depend on the tokens after it.

transformers 5.23.0, torch (CPU); random weights from a small config, no download. Run as is:
    python docs/findings/cpmant_causal_lm_sees_the_future.py
A causal LM's logits before position t must not change when the tokens from t on change (Llama,
GPT-2: exactly 0). CpmAntModel.forward builds `context` as all ones, and its attention mask lets
every context token attend to every other one, so the whole input is attended bidirectionally.
"""
import torch
from transformers import CpmAntConfig, CpmAntForCausalLM, LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
small = dict(vocab_size=128, hidden_size=64, num_attention_heads=4, num_hidden_layers=2)
models = {
    "cpmant": CpmAntForCausalLM(CpmAntConfig(**small, dim_head=16, dim_ff=128)).eval(),
    "llama (reference)": LlamaForCausalLM(LlamaConfig(**small, intermediate_size=128)).eval(),
}
g = torch.Generator().manual_seed(1)
x = torch.randint(3, 128, (1, 12), generator=g)
x2 = x.clone()
x2[:, 6:] = torch.randint(3, 128, (1, 6), generator=g)  # same first 6 tokens, different last 6
with torch.no_grad():
    for name, m in models.items():
        a, b = m(input_ids=x).logits[:, :6], m(input_ids=x2).logits[:, :6]
        print(f"{name}: max |change| of the logits at positions 0..5 when tokens 6..11 change: "
              f"{(a - b).abs().max().item():.3g} (logits' scale {a.abs().max().item():.3g})")
    # the loss a user trains with: labels at position t are visible to the model at position t - 1
    m = models["cpmant"]
    loss_a = m(input_ids=x, labels=x).loss
    loss_b = m(input_ids=x2, labels=x).loss  # same labels, later inputs changed
    print(f"cpmant: loss with the same labels, later inputs changed: {loss_a.item():.4f} -> {loss_b.item():.4f}")
    # and its cache, called as a decoding loop calls it: CpmAntModel.forward prepends its prompt
    # positions to the new tokens on every call, and the shapes no longer meet the cached keys
    for new in (1, 3):
        cache = m(input_ids=x[:, : 12 - new], use_cache=True).past_key_values
        try:
            m(input_ids=x[:, 12 - new:], past_key_values=cache, use_cache=True)
            print(f"cpmant: prefill {12 - new}, then {new} token(s) through the cache: ran")
        except RuntimeError as e:
            print(f"cpmant: prefill {12 - new}, then {new} token(s) through the cache: RuntimeError: {str(e).splitlines()[0]}")
