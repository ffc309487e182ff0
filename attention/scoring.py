"""How queries meet keys: one row per `score` kind, dispatched by the table below.

Each kind says which parameters it adds to a layer, how it transforms q and k before they meet,
how it turns them into (unscaled) scores, and whether PyTorch's fused SDPA can compute it (and
what SDPA then needs folded into q). The scale (1/sqrt(d_k), none, learned) is applied after, in
mha.py, the same for every kind.
"""
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


def no_params(h: int, d_k: int) -> dict:
    return {}


def same(q, k):
    return q, k


def dot(layer, q, k):
    """q k^T: (B, h, T_q, d_k) x (B, h, T_k, d_k) -> (B, h, T_q, T_k)."""
    return q @ k.transpose(-2, -1)


def cosine_qk(q, k):
    """Unit-length q and k: their dot product is a cosine in [-1, 1], whatever the scale of q and k."""
    return F.normalize(q, dim=-1), F.normalize(k, dim=-1)


def bilinear_params(h: int, d_k: int) -> dict:
    """W_b per head, started at the identity (dot-product). Redundant with W_q^T W_k: the point."""
    return {"W_b": torch.nn.Parameter(torch.eye(d_k).repeat(h, 1, 1))}


def bilinear(layer, q, k):
    """q^T W_b k."""
    return (q @ layer.W_b) @ k.transpose(-2, -1)


def bilinear_sdpa_q(layer, q):
    return q @ layer.W_b


def additive_params(h: int, d_k: int) -> dict:
    """Bahdanau's v_a per head; W_q and W_k serve as the MLP's input layer."""
    return {"v_a": torch.nn.Parameter(torch.randn(h, d_k) / math.sqrt(d_k))}


def additive(layer, q, k):
    """v_a^T tanh(q_i + k_j): materialises a (B, h, T_q, T_k, d_k) tensor."""
    s = torch.tanh(q.unsqueeze(-2) + k.unsqueeze(-3)) @ layer.v_a[None, :, None, :, None]
    return s.squeeze(-1)


@dataclass(frozen=True)
class Scoring:
    params: Callable            # (h, d_k) -> {name: Parameter} the layer registers
    qk: Callable                # (q, k) -> (q, k), per head, before the cache and the scores
    scores: Callable            # (layer, q, k) -> (B, h, T_q, T_k) unscaled scores
    sdpa_q: Callable | None     # (layer, q) -> q for SDPA's dot product; None: SDPA cannot express it


SCORINGS = {
    "dot": Scoring(no_params, same, dot, sdpa_q=lambda layer, q: q),
    "cosine": Scoring(no_params, cosine_qk, dot, sdpa_q=lambda layer, q: q),
    "bilinear": Scoring(bilinear_params, same, bilinear, sdpa_q=bilinear_sdpa_q),
    "additive": Scoring(additive_params, same, additive, sdpa_q=None),
}
