"""A small decoder-only transformer LM (pre-LN), built on MultiHeadAttention."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention.config import ModelConfig
from attention.logit_fixes import SigmaReparamLinear
from attention.mha import KVCache, MultiHeadAttention
from attention.variance import GPT2_STD, qk_weight_std

__all__ = ["Block", "ModelConfig", "TransformerLM"]


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, idx: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = MultiHeadAttention(cfg.attn)
        self.attn.name, self.attn.layer_idx = f"L{idx}", idx
        self.ln_2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias) if cfg.mlp else None
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias), nn.GELU(),
                                 nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias), nn.Dropout(cfg.dropout)
                                 ) if cfg.mlp else None
        self.drop = nn.Dropout(cfg.dropout)
        self.residual = cfg.residual

    def forward(self, x, key_padding_mask=None, cache=None, positions=None):
        h = self.ln_1(x)
        a, _ = self.attn(h, h, h, is_causal=True, key_padding_mask=key_padding_mask, cache=cache,
                         positions=positions)
        x = x + self.drop(a) if self.residual else self.drop(a)
        if self.mlp is None:
            return x
        m = self.mlp(self.ln_2(x))
        return x + m if self.residual else m


class TransformerLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.d_model) if cfg.pos == "learned" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.head.weight = self.tok_emb.weight
        self.init_weights(cfg.init, cfg.qk_gain)

    @torch.no_grad()
    def init_weights(self, scheme: str, qk_gain: float = 1.0):
        if scheme in ("gpt2", "unit_variance"):
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, 0.0, GPT2_STD)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)
            # GPT-2: residual projections scaled by 1/sqrt(2 n_layers) so the stream's variance stays put
            for b in self.blocks:
                for w in (b.attn.W_o.weight,) + ((b.mlp[2].weight,) if b.mlp is not None else ()):
                    nn.init.normal_(w, 0.0, GPT2_STD / math.sqrt(2 * self.cfg.n_layers))
        if scheme == "unit_variance":
            # q and k components of variance 1 given LayerNorm'd inputs: the variance argument's premise
            for b in self.blocks:
                for w in (b.attn.W_q.weight, b.attn.W_k.weight):
                    nn.init.normal_(w, 0.0, qk_weight_std("unit_variance", self.cfg.d_model))
        for b in self.blocks:
            b.attn.W_q.weight.mul_(qk_gain)
            b.attn.W_k.weight.mul_(qk_gain)
        for m in self.modules():  # sigma-reparam: gamma = sigma(W) of the init, so W_hat = W at step 0
            if isinstance(m, SigmaReparamLinear):
                m.reset_gamma()

    @property
    def attentions(self) -> list[MultiHeadAttention]:
        return [b.attn for b in self.blocks]

    def forward(self, idx, key_padding_mask=None, cache: KVCache | None = None, start: int | None = None):
        """idx (B, T) -> logits (B, T, V). With a cache, idx holds only the new tokens.
        start: the first token's position (default: after the cache); rotary positions have no
        table, so a window may sit anywhere in a long context."""
        B, T = idx.shape
        start = (0 if cache is None else cache.length) if start is None else start
        if self.pos_emb is not None and start + T > self.cfg.block_size:
            raise ValueError(f"sequence length {start + T} exceeds model.block_size={self.cfg.block_size}")
        pos = self.positions(start, T, key_padding_mask, idx.device)  # (T,) or (B, T)
        x = self.tok_emb(idx) if self.pos_emb is None else self.tok_emb(idx) + self.pos_emb(pos)
        x = self.drop(x)
        for b in self.blocks:
            x = b(x, key_padding_mask=key_padding_mask, cache=cache, positions=pos)
        return self.head(self.ln_f(x))

    def positions(self, start: int, T: int, key_padding_mask=None, device=None) -> torch.Tensor:
        """Absolute positions of the T new tokens: counted from the first column (from_padding), or,
        given a (B, T_k) padding mask, from each row's first real token (HF: mask.cumsum(-1) - 1)."""
        if self.cfg.pad_positions == "from_first_token" and key_padding_mask is not None:
            return (key_padding_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -T:]  # (B, T)
        return torch.arange(start, start + T, device=device)                      # (T,)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens: int, greedy: bool = True, use_cache: bool = True):
        """Incremental decoding with a KV cache: the prompt once, then one token per step.
        use_cache=False reruns the whole sequence each step: the reference the cache must match."""
        cache = KVCache(self.cfg.n_layers) if use_cache else None
        logits = self(idx, cache=cache)
        out = idx
        for _ in range(max_new_tokens):
            last = logits[:, -1]
            nxt = last.argmax(-1, keepdim=True) if greedy else torch.multinomial(F.softmax(last, -1), 1)
            out = torch.cat([out, nxt], dim=1)
            if out.shape[1] >= self.cfg.block_size:
                break
            logits = self(nxt, cache=cache) if use_cache else self(out)
        return out

    def param_count(self) -> dict[str, int]:
        attn = sum(p.numel() for a in self.attentions for p in a.parameters())
        total = sum(p.numel() for p in self.parameters())
        return {"total": total, "attention": attn}
