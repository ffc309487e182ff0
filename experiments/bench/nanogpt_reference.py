"""nanoGPT's model.py and train.py loop (github.com/karpathy/nanoGPT, MIT), transcribed for its CPU
shakespeare_char recipe: an independent second path to check `bench shakespeare` against.

It shares nothing with attention/ or experiments/train.py but the corpus: fused c_attn, its own
init, decay groups, get_lr and get_batch (windows from the global torch RNG), as nanoGPT has them.
If our loop and this one land on the same val loss, a gap to a published figure is not ours.
"""
import math
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=False)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in self.c_attn(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=False)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd, bias=False)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=False)
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=False)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=False)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for b in self.h:
            x = b(x)
        return self.lm_head(self.ln_f(x))


def configure_optimizer(model: GPT, o: dict) -> torch.optim.AdamW:
    """Every 2-D parameter decayed (embeddings included), norms not: nanoGPT's groups."""
    params = list(model.parameters())
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": o["weight_decay"]},
                              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                             lr=o["lr"], betas=tuple(o["betas"]))


def get_lr(it: int, o: dict) -> float:
    warmup, decay, lr, min_lr = o["warmup_steps"], o["decay_steps"], o["lr"], o["min_lr"]
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay:
        return min_lr
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * (it - warmup) / (decay - warmup))) * (lr - min_lr)


def get_batch(data: torch.Tensor, block: int, batch_size: int, device):
    ix = torch.randint(len(data) - block, (batch_size,))
    x = torch.stack([data[i:i + block] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block] for i in ix])
    return x.to(device), y.to(device)


def train_step(model: GPT, opt, x, y, it: int, o: dict, grad_clip: float) -> torch.Tensor:
    for g in opt.param_groups:
        g["lr"] = get_lr(it, o)
    logits = model(x)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


# nanoGPT's CPU command for shakespeare_char: --eval_iters=20, and its config's eval_interval = 250
EVAL_INTERVAL, EVAL_ITERS = 250, 20


@torch.no_grad()
def estimate_loss(model: GPT, splits: dict, block: int, batch_size: int, device) -> dict:
    """nanoGPT's estimate_loss: EVAL_ITERS batches of each split (from the global RNG, as there)."""
    model.eval()
    out = {}
    for name, data in splits.items():
        losses = torch.zeros(EVAL_ITERS)
        for k in range(EVAL_ITERS):
            x, y = get_batch(data, block, batch_size, device)
            logits = model(x)
            losses[k] = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1)).item()
        out[name] = losses.mean().item()
    model.train()
    return out


class Loop:
    """nanoGPT's loop on the composed nanogpt_cpu config, advanced `n` iterations at a time (the
    benchmark interleaves it with ours), with what its train.py does every EVAL_INTERVAL
    iterations and its per-iteration time includes: estimate_loss on train and val, and a
    checkpoint (model and optimizer) into out_dir when the val loss improved."""

    def __init__(self, splits: dict, vocab_size: int, cfg: dict, device, out_dir):
        m, t = cfg["model"], cfg["train"]
        self.splits, self.device, self.out_dir = splits, device, Path(out_dir)
        self.block, self.bs, self.grad_clip, self.optim_cfg = cfg["data"]["seq_len"], t["batch_size"], t["grad_clip"], cfg["optim"]
        torch.manual_seed(cfg["seed"])
        self.model = GPT(vocab_size, self.block, m["n_layers"], m["n_heads"], m["d_model"]).to(device)
        self.opt = configure_optimizer(self.model, cfg["optim"])
        self.it, self.best_val = 0, float("inf")

    def advance(self, n: int) -> None:
        for _ in range(n):
            if self.it % EVAL_INTERVAL == 0:
                losses = estimate_loss(self.model, self.splits, self.block, self.bs, self.device)
                if losses["val"] < self.best_val:
                    self.best_val = losses["val"]
                    if self.it > 0:
                        torch.save({"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                                    "iter_num": self.it, "best_val_loss": self.best_val}, self.out_dir / "ckpt.pt")
            x, y = get_batch(self.splits["train"], self.block, self.bs, self.device)
            train_step(self.model, self.opt, x, y, self.it, self.optim_cfg, self.grad_clip)
            self.it += 1
