"""The public reference implementations, each built small from its own source and examined by the
doctor as a user would point it at them. Their code is never copied here: a release from PyPI,
installed in a directory of its own under --pinned (PINNED has the commands), or a clone the user
names (`--source nanoGPT=PATH`), whose commit the evidence records.

Each REFERENCES entry: where the code comes from, how it is built small (random weights, 2 layers,
width 32, positions up to 4160 so that long_positions can reach +4096), what the code lacks by
nature (every check that does not run must be n/a for one of these), and each fail's explanation
(a known hazard with its thread, or a bug in that code with its line).
"""
import ast
import copy
import math
import os
import runpy
import subprocess
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_doctor import Adapter

MAX_POS = 4160   # positions up to +4096 + 16 (long_positions)
SCALE_AFTER = ("q k^T is formed in float16 before the 1/sqrt(d_k) scale: at the doctor's stress scores (~3e4) it "
               "passes 65504 and the softmax returns NaN (the textbook order; huggingface/transformers #33317 on "
               "Qwen2's eager path)")


# -- builders (each runs in a subprocess whose sys.path holds the source) -----------------------

def nanogpt(src):
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=MAX_POS, vocab_size=64, n_layer=2, n_head=4, n_embd=32, dropout=0.0, bias=True))


def mingpt(src):
    from mingpt.model import GPT
    c = GPT.get_default_config()
    c.model_type, c.n_layer, c.n_head, c.n_embd, c.vocab_size, c.block_size = None, 2, 4, 32, 64, MAX_POS
    torch.manual_seed(0)
    return GPT(c)


@contextmanager
def _cuda_is_here():
    """Meta's Llama makes its KV cache with .cuda(): on this CPU machine, here is where it stays."""
    cuda = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self
    try:
        yield
    finally:
        torch.Tensor.cuda = cuda


def llama(src):
    """llama/model.py loaded as a file (its package imports the tokenizer); fairscale's model
    parallelism on one process; random weights (its layers leave them to a checkpoint)."""
    import torch.distributed as dist
    from fairscale.nn.model_parallel import initialize as fs
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        dist.init_process_group("gloo", rank=0, world_size=1)
    if not fs.model_parallel_is_initialized():
        fs.initialize_model_parallel(1)
    mod = runpy.run_path(str(Path(src) / "llama" / "model.py"))
    torch.manual_seed(0)
    with _cuda_is_here():
        model = mod["Transformer"](mod["ModelArgs"](dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64,
                                                    multiple_of=16, max_batch_size=16, max_seq_len=MAX_POS))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02) if p.dim() >= 2 else p.fill_(1.0)
    return model


def litgpt(src):
    from litgpt.config import Config
    from litgpt.model import GPT
    torch.manual_seed(0)
    return GPT(Config(block_size=MAX_POS, vocab_size=64, padded_vocab_size=64, n_layer=2, n_head=4, n_query_groups=2,
                      n_embd=32, head_size=8, rotary_percentage=1.0, parallel_residual=False, bias=False,
                      norm_class_name="RMSNorm", mlp_class_name="LLaMAMLP", intermediate_size=64))


def x_transformers(src):
    from x_transformers import Decoder, TransformerWrapper
    torch.manual_seed(0)
    return TransformerWrapper(num_tokens=64, max_seq_len=MAX_POS, attn_layers=Decoder(dim=32, depth=2, heads=4, attn_dim_head=8))


ANNOTATED = ("EncoderDecoder", "Generator", "clones", "Encoder", "LayerNorm", "SublayerConnection", "EncoderLayer",
             "Decoder", "DecoderLayer", "subsequent_mask", "attention", "MultiHeadedAttention",
             "PositionwiseFeedForward", "Embeddings", "PositionalEncoding", "make_model")


def annotated_source(src) -> dict:
    """The model's definitions from the_annotated_transformer.py (a notebook as a script: its
    training and plotting code, and the imports they need, are left out), compiled with their own
    file name and line numbers."""
    path = Path(src) / "the_annotated_transformer.py"
    tree = ast.parse(path.read_text())
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in ANNOTATED]
    ns = {"torch": torch, "nn": nn, "math": math, "copy": copy, "log_softmax": F.log_softmax, "pad": F.pad}
    exec(compile(ast.Module(defs, type_ignores=[]), str(path), "exec"), ns)
    return ns


class AnnotatedDecoder(Adapter):
    """The Annotated Transformer's decoder as a causal LM of the target tokens over a fixed source
    (an encoder-decoder's forward(src, tgt, src_mask, tgt_mask) has no convention to find): the
    target mask is its subsequent_mask and the padding; positions index its PositionalEncoding's
    table."""
    kind, causal, SRC = "lm", True, 8

    def __init__(self, model, ns):
        super().__init__(model, "the Annotated Transformer (decoder over a fixed source)")
        self.ns = ns
        self.vocab_size = model.tgt_embed[0].lut.num_embeddings
        self.max_len = model.tgt_embed[1].pe.shape[1]

    def forward(self, x, mask=None, positions=None):
        B, T = x.shape
        src = (torch.arange(self.SRC, device=x.device) % self.vocab_size).expand(B, -1)
        keep = self.ns["subsequent_mask"](T).to(x.device)
        if mask is not None:
            keep = keep & mask[:, None, :]
        table = self.module.tgt_embed[1]
        pe = table.pe
        if positions is not None:   # its forward adds pe[:, :T]: a (B, T, d) table, row b at positions[b]
            table.pe = pe[0][positions]
        try:
            out = self.module(src, x, torch.ones(B, 1, self.SRC, dtype=torch.bool, device=x.device), keep)
        finally:
            table.pe = pe
        return self.module.generator(out)

    def embedding(self):
        return self.module.tgt_embed[0].lut


def annotated(src):
    ns = annotated_source(src)
    torch.manual_seed(0)
    return AnnotatedDecoder(ns["make_model"](64, 64, N=2, d_model=32, d_ff=64, h=4, dropout=0.1).eval(), ns)


NO_MASK = "its forward takes no padding mask"
REFERENCES = [
    {"name": "nanoGPT", "repo": "karpathy/nanoGPT", "source": "clone", "build": nanogpt, "file": "model.py",
     "by_nature": {"kv_cache": "no KV cache (generate() reruns the whole sequence)", "padding": NO_MASK,
                   "fully_masked_rows": NO_MASK,
                   "path_agreement": "one attention path: the manual one is built only without SDPA (torch < 2)"},
     "findings": {}},
    {"name": "minGPT", "repo": "karpathy/minGPT", "source": "clone", "build": mingpt, "file": "mingpt/model.py",
     "by_nature": {"kv_cache": "no KV cache (generate() reruns the whole sequence)", "padding": NO_MASK,
                   "fully_masked_rows": NO_MASK, "path_agreement": "one attention path"},
     "findings": {"low_precision": "mingpt/model.py:62, att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1))): "
                                   + SCALE_AFTER}},
    {"name": "Meta Llama", "repo": "meta-llama/llama", "source": "clone", "build": llama, "file": "llama/model.py",
     "needs": ["fairscale-0.4.13"],
     "by_nature": {"padding": NO_MASK + " (forward(tokens, start_pos))", "fully_masked_rows": NO_MASK,
                   "path_agreement": "one attention path"},
     "findings": {"low_precision": "llama/model.py:298, scores = torch.matmul(xq, keys.transpose(2, 3)) / "
                                   "math.sqrt(self.head_dim): " + SCALE_AFTER}},
    {"name": "LitGPT", "package": "litgpt", "version": "0.5.13", "source": "pypi", "build": litgpt,
     "pinned": "litgpt-0.5.13", "needs": ["litgpt-deps"], "file": "litgpt/model.py",
     "by_nature": {"padding": NO_MASK + " (forward(idx, input_pos=None, ...))", "fully_masked_rows": NO_MASK,
                   "path_agreement": "one attention path (scaled_dot_product_attention)"},
     "findings": {}},
    {"name": "x-transformers", "package": "x-transformers", "version": "1.22.24", "source": "pypi",
     "build": x_transformers, "pinned": "xt-1.22.24", "file": "x_transformers/attend.py",
     "by_nature": {"path_agreement": "one attention path as built (attn_flash=False, the library's default: flash "
                                     "is a constructor option whose asserts depend on the other options)"},
     "findings": {"low_precision": "x_transformers/attend.py:299, dots = einsum(...) * scale: " + SCALE_AFTER,
                  "padding": "x_transformers/x_transformers.py:216, AbsolutePositionalEmbedding counts positions from "
                             "the first column: left-padded rows score their real tokens at shifted positions unless "
                             "the caller passes pos (or seq_start_pos) (huggingface/transformers #21080's hazard)"}},
    {"name": "the Annotated Transformer", "repo": "harvardnlp/annotated-transformer", "source": "clone", "build": annotated,
     "file": "the_annotated_transformer.py",
     "by_nature": {"kv_cache": "no KV cache (greedy_decode reruns the decoder over the whole prefix)",
                   "path_agreement": "one attention path",
                   # not by nature: an encoder-decoder, examined as its decoder over a fixed source
                   "encoder_decoder": "not examined: AnnotatedDecoder drives the decoder over a fixed source "
                                      "(no encoded_forward / encoded_decode: the encoder's padding as the "
                                      "cross-attention sees it is not looked at)"},
     "findings": {"padding": "the_annotated_transformer.py:767, PositionalEncoding adds pe[:, :T] from the first "
                             "column: left-padded rows score their real tokens at shifted positions "
                             "(huggingface/transformers #21080's hazard)",
                  "low_precision": "the_annotated_transformer.py:524, scores.masked_fill(mask == 0, -1e9): -1e9 does "
                                   "not fit float16 and masked_fill raises (a float16 model cannot run at all); line 522 "
                                   "also forms q k^T before the scale"}},
]
# what none of the references has: a declared sliding window, a save_pretrained / from_pretrained pair, an
# encoder input, token types, positions of several rows (the Annotated Transformer's encoder: its own entry)
EVERY_ONE_BY_NATURE = {"sliding_window": "declares no sliding window",
                       "config_roundtrip": "no save and load of its own (no save_pretrained / from_pretrained)",
                       "encoder_decoder": "a decoder-only LM: no encoder input",
                       "bidirectional_prefix": "a text LM: no token types, no prefix",
                       "multimodal_positions": "a text LM: one row of positions"}
REFERENCES = [{**r, "by_nature": {**EVERY_ONE_BY_NATURE, **r["by_nature"]}} for r in REFERENCES]
BY_NAME = {r["name"]: r for r in REFERENCES}
PINNED = [
    "pip install --no-deps --target xt-1.22.24 x-transformers==1.22.24 einops==0.8.1",
    "pip install --no-deps --target litgpt-0.5.13 litgpt==0.5.13",
    "pip install --no-deps --target litgpt-deps lightning==2.6.6 lightning-utilities==0.15.2 torchmetrics==1.8.2 "
    "fsspec==2026.9.0 psutil==7.2.2",
    "pip install --no-deps --target fairscale-0.4.13 fairscale==0.4.13",
]
CLONES = {r["name"]: f"git clone https://github.com/{r['repo']}" for r in REFERENCES if r["source"] == "clone"}


def provenance(ref, source: Path | None) -> dict:
    """Which code the row came from: the clone's commit (and whether the file built from has local
    changes), or the release (its dist-info in the directory it was installed in)."""
    if ref["source"] == "pypi":
        dist = ref["package"].replace("-", "_")
        found = sorted(p.name[len(dist) + 1:-len(".dist-info")] for p in Path(source).glob(f"{dist}-*.dist-info"))
        return {"release": f"{ref['package']}=={found[0] if found else 'unknown'}"}
    git = lambda *a: subprocess.run(["git", "-C", str(source), *a], capture_output=True, text=True).stdout.strip()
    return {"repo": f"github.com/{ref['repo']}", "commit": git("rev-parse", "HEAD") or "unknown (not a git clone)",
            "file_changed": bool(git("status", "--porcelain", "--", ref["file"]))}


def examine_one(name: str, source: str) -> dict:
    """Build one reference (its source first on sys.path: a clone, or a release's directory) and
    examine it: the result, and its provenance."""
    import sys

    from attention_doctor import examine
    ref = BY_NAME[name]
    sys.path.insert(0, source)
    r = examine(ref["build"](source), name=name)
    return {"provenance": provenance(ref, Path(source)), "result": r.to_dict()}
