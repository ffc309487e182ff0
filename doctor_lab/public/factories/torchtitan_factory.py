"""torchtitan's llama3 `Transformer` (torchtitan/models/llama3/model/model.py), small with random
weights from its own init_weights: RoPE as a complex64 `freqs_cis` buffer. Needs the checkout on
PYTHONPATH. Stubbed (imported by torchtitan's package __init__, unused by the model): the config
CLI (tyro), the data loader (torchdata), metrics (torch.utils.tensorboard, which raises without
tensorboard), HF datasets, and the MoE Triton kernels module (imports triton; a dense model has no
MoE)."""
import torch

from doctor_lab.public.stubs import stub

stub("tyro", "tyro.constructors")
stub("torchdata", "torchdata.stateful_dataloader")
stub("torch.utils.tensorboard")
stub("datasets", "datasets.distributed")
stub("torchtitan.models.moe.kernels")

from torchtitan.models.llama3.model.args import TransformerModelArgs  # noqa: E402
from torchtitan.models.llama3.model.model import Transformer  # noqa: E402

MAX_POS = 4224   # long_positions reaches +4096 beyond T = 16


def small():
    torch.manual_seed(0)
    model = Transformer(TransformerModelArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64,
                                             multiple_of=16, max_seq_len=MAX_POS))
    with torch.no_grad():   # torchtitan calls init_weights under no_grad
        model.init_weights()
    return model.eval()


def phases_in_bfloat16():
    """Planted: the RoPE angles position * frequency rounded to bfloat16 before the complex
    exponential (the table stays complex64): relative positions hold near 0 and drift far out."""
    model = small()
    with torch.no_grad():
        freqs = model.freqs_cis[1].angle()      # position 1: the frequencies themselves
        angles = torch.outer(torch.arange(MAX_POS).bfloat16(), freqs.bfloat16()).float()
        model.freqs_cis = torch.polar(torch.ones_like(angles), angles)
    return model
