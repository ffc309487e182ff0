"""Which tensor of the target's own state an in-place write of another dtype raised on. Under
autocast a cache set up in the weights' dtype (gpt-fast's KVCache: float32 on a float32 model)
takes no bfloat16 write: the target's state has its dtype fixed at set-up, and the target runs in
low precision by casting its weights (which the doctor runs as well). A write into a tensor the
forward made itself (DBRX's experts, X-MOD's adapters: `zeros_like` of a float32 input) is the
forward's own failure under autocast, not a limit: it is not reported here."""
import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from attention_doctor.signals import TargetRaised

SET_ITEM = "__setitem__"


def _writes_in_place(func) -> bool:
    name = getattr(func, "__name__", "")
    return name == SET_ITEM or (name.endswith("_") and not name.startswith("_"))


def _state(module: nn.Module):
    """(name, tensor) of what the module keeps between calls: its buffers, and tensors set as
    plain attributes of its modules (a cache kept outside register_buffer)."""
    yield from module.named_buffers()
    for prefix, m in module.named_modules():
        for k, v in vars(m).items():
            if isinstance(v, torch.Tensor) and not isinstance(v, nn.Parameter) and not k.startswith("_"):
                yield (f"{prefix}.{k}" if prefix else k), v


class _FirstFailedWrite(TorchFunctionMode):
    """Records the first in-place write that raised while the mode is on: (destination, sources, the
    module's state as it was then: a cache set up inside the call is gone after it)."""

    def __init__(self, module):
        super().__init__()
        self.module, self.failed = module, None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            return func(*args, **kwargs)
        except Exception:  # noqa: BLE001 -- only looked at, then re-raised unchanged to the target's own code
            if self.failed is None and _writes_in_place(func) and args and isinstance(args[0], torch.Tensor):
                sources = [a for a in (*args[1:], *kwargs.values()) if isinstance(a, torch.Tensor)]
                self.failed = (args[0], sources, list(_state(self.module)))
            raise


def state_write_raised(module: nn.Module, run) -> str | None:
    """Runs run() (which raises) again; where the first in-place write that raised wrote into the
    module's own state from a tensor of another floating dtype, that write in words (the state's
    name and both dtypes), else None. What run() raises is swallowed: the caller has it already."""
    mode = _FirstFailedWrite(module)
    try:
        with mode:
            run()
    except (TargetRaised, Exception):  # noqa: BLE001 -- the raise is the caller's, already recorded; only where it came from is asked
        pass
    if mode.failed is None:
        return None
    dst, sources, state = mode.failed
    other = next((s.dtype for s in sources if s.is_floating_point() and s.dtype != dst.dtype), None)
    if other is None or not dst.is_floating_point():
        return None
    ptr = dst.untyped_storage().data_ptr()
    if not ptr:   # an empty tensor has no storage to share
        return None
    name = next((n for n, t in state if t.untyped_storage().data_ptr() == ptr), None)
    if name is None:
        return None
    dtype = lambda t: str(t).replace("torch.", "")
    return (f"its state `{name}` is {dtype(dst.dtype)} and takes no {dtype(other)} write under autocast; "
            "it runs in low precision with its weights cast")
