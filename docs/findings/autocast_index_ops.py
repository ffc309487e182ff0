"""DbrxForCausalLM and XmodForCausalLM raise under autocast: each writes half-precision outputs
into a float32 buffer with an in-place index op (DBRX's experts: index_add_; X-MOD's language
adapters: an index put), which autocast does not promote.

transformers 5.23.0, torch (CPU); random weights from small configs, no download. Run as is:
    python docs/findings/autocast_index_ops.py
Mixtral, whose experts cast to the buffer's dtype before index_add_, runs the same way.
"""
import torch
from transformers import (DbrxConfig, DbrxForCausalLM, MixtralConfig, MixtralForCausalLM, XmodConfig,
                          XmodForCausalLM)

torch.manual_seed(0)
dbrx = DbrxConfig(d_model=64, n_heads=4, n_layers=2, vocab_size=128, max_seq_len=64,
                  attn_config=dict(kv_n_heads=2, clip_qkv=8.0),  # the default clip_qkv None cannot run
                  ffn_config=dict(ffn_hidden_size=128, moe_num_experts=4, moe_top_k=2))
dbrx.attn_config.rope_theta = 500000.0  # read by DbrxAttention, absent from the default attention config
xmod = XmodConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128, is_decoder=True, default_language="en_XX")
mixtral = MixtralConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4)
x = torch.randint(3, 128, (2, 8))
for name, model in [("dbrx", DbrxForCausalLM(dbrx)), ("xmod", XmodForCausalLM(xmod)),
                    ("mixtral (reference)", MixtralForCausalLM(mixtral))]:
    model.eval()
    for dtype in (torch.bfloat16, torch.float16):
        try:
            with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
                y = model(input_ids=x).logits
            print(f"{name} under {dtype} autocast: ran, logits {tuple(y.shape)}")
        except RuntimeError as e:
            print(f"{name} under {dtype} autocast: RuntimeError: {str(e).splitlines()[0]}")
