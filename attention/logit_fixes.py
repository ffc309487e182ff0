"""Fixes for exploding attention logits that change the layer, not the optimizer's settings.

  softcap(s, c)        c * tanh(s / c): every score in (-c, c) (Gemma 2 caps attention logits at 50)
  SigmaReparamLinear   W_hat = gamma / sigma(W) * W (Zhai et al. 2023, arXiv 2303.06296): sigma by
                       one power-iteration step per training forward from a persistent u, gamma a
                       learned scalar started at sigma(W), so W_hat = W at init
  qk_clip_factors      QK-clip (Kimi K2, arXiv 2507.20534): the per-head factor sqrt(tau / max logit)
                       that W_q's and W_k's rows of a head are multiplied by when its logit passed tau
qk-layernorm is `attention.qk_norm` in mha.py.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def softcap(scores: torch.Tensor, cap: float) -> torch.Tensor:
    return cap * torch.tanh(scores / cap)


class SigmaReparamLinear(nn.Linear):
    """nn.Linear whose effective weight has spectral norm gamma (the paper's Eq. 2)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__(in_features, out_features, bias=bias)
        self.gamma = nn.Parameter(torch.ones(()))
        # a fixed generator: turning the fix on must not move the global RNG (the other layers' init)
        g = torch.Generator().manual_seed(0)
        self.register_buffer("u", F.normalize(torch.randn(out_features, generator=g), dim=0))

    @torch.no_grad()
    def power_iteration(self, steps: int = 1) -> None:
        """Move u towards W's top left singular vector (in place, persistent across steps)."""
        W = self.weight.float()
        u = self.u
        for _ in range(steps):
            v = F.normalize(W.t() @ u, dim=0)
            u = F.normalize(W @ v, dim=0)
        self.u.copy_(u)

    def sigma(self) -> torch.Tensor:
        """u^T W v: the spectral-norm estimate, differentiable in W (u and v held fixed, as the paper)."""
        with torch.no_grad():
            v = F.normalize(self.weight.t() @ self.u, dim=0)
        return self.u.clone() @ self.weight @ v

    @torch.no_grad()
    def reset_gamma(self, steps: int = 100) -> None:
        """After init: converge u, then gamma = sigma(W) so the layer starts as plain nn.Linear."""
        self.power_iteration(steps)
        self.gamma.copy_(self.sigma())

    def forward(self, x):
        if self.training:
            self.power_iteration(1)
        return F.linear(x, self.gamma / self.sigma() * self.weight, self.bias)


def qk_clip_factors(max_logit: torch.Tensor, tau: float, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(factor per query head (h,), factor per kv head (h_kv,)): sqrt(tau / max logit) where the
    head's max logit passed tau, else 1. A kv head shared by `group` query heads takes the smallest
    factor of its group, so every head's logits scale by at most tau / its max."""
    f = (tau / max_logit.clamp_min(tau)).sqrt()
    return f, f.view(-1, group).amin(-1)
