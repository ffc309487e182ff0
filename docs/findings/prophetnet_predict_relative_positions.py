"""ProphetNetForCausalLM: the logits at a position depend on later tokens and on the sequence
length, through the predict stream's relative-position embeddings. Exit 1 while they do (the bug),
0 when the logits are causal and right padding leaves them unchanged.

transformers 5.23.0 and 5.25.0, torch (CPU, float32 and float64); random weights from a small config, no
download; seconds. Run as is:
    python docs/findings/prophetnet_predict_relative_positions.py
ProphetNetNgramSelfAttention.get_predict_relative_pos_embeddings (modeling_prophetnet.py) permutes
the embeddings to (batch, position, stream, head) order and gathers them against buckets laid out
in (stream, batch, head, position) order, then views the result as (batch, stream, head, position):
the query at one position gets the relative-position embedding computed from another position's
hidden state (which position depends on the head and the sequence length).
"""
import sys

import torch
from transformers import ProphetNetConfig, ProphetNetForCausalLM

TOL = 1e-6  # a causal model moves earlier logits by exactly 0 (masked keys weigh exp(-huge) = 0)
torch.manual_seed(0)
cfg = ProphetNetConfig(vocab_size=128, hidden_size=128, num_encoder_layers=2, num_decoder_layers=2,   # head size 64,
                       num_encoder_attention_heads=2, num_decoder_attention_heads=2,                # ProphetNet-large's
                       encoder_ffn_dim=256, decoder_ffn_dim=256, max_position_embeddings=512)
m = ProphetNetForCausalLM(cfg).eval()
g = torch.Generator().manual_seed(1)
x = torch.randint(3, 128, (2, 16), generator=g)
rel = lambda a, b: ((a - b).abs().max() / b.abs().max()).item()  # noqa: E731
leak = {}
for dtype in (torch.float32, torch.float64):  # float64: the leak is not rounding
    m.to(dtype)
    with torch.no_grad():
        x2 = x.clone()
        x2[:, 1:] = torch.randint(3, 128, (2, 15), generator=torch.Generator().manual_seed(2))
        leak[dtype] = rel(m(input_ids=x2).logits[:, :1], m(input_ids=x).logits[:, :1])
    print(f"{str(dtype)[6:]}: logits at position 0 when tokens 1..15 change: expected <= {TOL:g}, actual {leak[dtype]:.3g}")
m.float()
with torch.no_grad():  # right padding: 12 tokens, then 4 pads masked out, against the 12 tokens alone
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[:, 12:] = 0
    padded = rel(m(input_ids=x.masked_fill(mask == 0, cfg.pad_token_id), attention_mask=mask).logits[:, :12],
                 m(input_ids=x[:, :12]).logits)
print(f"float32: right padding (12 tokens + 4 pads) against the 12 tokens alone: expected <= 1e-05, actual {padded:.3g}")
emb = m.get_input_embeddings()(x).detach().requires_grad_(True)
m(inputs_embeds=emb).logits[:, 0].sum().backward()
grad = emb.grad[:, 1:].abs().amax(dim=(0, 2))
print(f"|d logits[0] / d embedding[t]| for t = 1..15: {' '.join(f'{v:.2g}' for v in grad.tolist())} (expected all 0)")
ok = grad.max().item() == 0 and max(leak.values()) <= TOL and padded <= 1e-5
print("OK: causal, and independent of the sequence length" if ok else
      "BUG: earlier logits read later positions' predict-stream embeddings")
sys.exit(0 if ok else 1)
