"""Whether a forward has attention weights at all, seen at the dispatcher.

The probe (probes.py) reads attention through torch's function modes, which do not see inside
TorchScript functions or a library's own ops. Where it saw no attention call, a score check cannot
tell "nothing to see" (a state-space or recurrent mixer: Mamba, RWKV's recurrence) from "could not
see" (a scripted softmax, sigmoid attention, a fused kernel) by that alone. This looks one level
down: every op the forward dispatches, scripted code included. Attention weights are there if any
op is a softmax, an SDPA or flex kernel, or if any op's output is a token-by-token matrix (two axes
as long as the input: scores, weights, a mask built from the input). An op from outside torch's own
namespaces is not looked into: attention is then not ruled out either. A linear attention that
never forms its weights (phi(K)^T V first) has none to examine."""
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops that are attention by themselves (softmax, SDPA's kernels and its math path, flex)
ATTENTION_OPS = ("softmax", "scaled_dot_product", "flash_attention", "efficient_attention", "flex_attention",
                 "cudnn_attention", "_fused_sdp")
OWN_NAMESPACES = ("aten", "prim", "prims")
# the input length it watches: a prime no model dimension is likely to equal (a 16-wide state next to
# 16 tokens would read as a token-by-token matrix)
LENGTH = 13


@dataclass(frozen=True)
class Mixing:
    """What the dispatcher saw: `weights` names the first op that is (or produced) attention
    weights, `opaque` the first op the doctor cannot look into ("" for none); `ops` how many ran."""
    weights: str
    opaque: str
    ops: int

    @property
    def none(self) -> bool:
        """No attention weights anywhere in the forward, and nothing that could hide them."""
        return not self.weights and not self.opaque and self.ops > 0

    def said(self) -> str:
        return (f"of the {self.ops} ops its forward dispatched, none is a softmax, SDPA or flex kernel and none's "
                "output is a token-by-token matrix")


def _token_by_token(t, length: int) -> bool:
    """t is a floating tensor with two axes of `length` (a T x T matrix, batched or not)."""
    return isinstance(t, torch.Tensor) and t.is_floating_point() and list(t.shape).count(length) >= 2


class _Watch(TorchDispatchMode):
    def __init__(self, length: int):
        super().__init__()
        self.length, self.weights, self.opaque, self.ops = length, "", "", 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        if self.weights or self.opaque:
            return out
        name = func.name()
        if func.namespace not in OWN_NAMESPACES:
            self.opaque = name
        elif any(a in name for a in ATTENTION_OPS):
            self.weights = name
        elif any(_token_by_token(o, self.length) for o in (out if isinstance(out, (tuple, list)) else (out,))):
            self.weights = f"{name} (a {self.length} x {self.length} output)"
        return out


def watched(forward, length: int) -> Mixing:
    """Mixing of one call of `forward` (no arguments) on an input of `length` positions."""
    with torch.no_grad(), _Watch(length) as w:
        forward()
    return Mixing(w.weights, w.opaque, w.ops)
