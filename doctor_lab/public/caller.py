"""The caller's model before and after examine(), from Python as a user holds it (the command line
builds its own model, which nobody can look at after): the target built by its factory, put in
train mode and float64 (complex buffers stay complex under .double()), examined, then compared
tensor by tensor, bit for bit, with its modules' modes, dtypes and devices.

    python -m doctor_lab.public.caller FACTORY.py:FN      # prints one JSON object
"""
import json
import sys

import torch

from attention_doctor import examine
from attention_doctor.targets import resolve


def state(model) -> dict:
    return {"modes": {n: m.training for n, m in model.named_modules()},
            "tensors": {n: t.detach().clone() for n, t in [*model.named_parameters(), *model.named_buffers()]}}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes: bit for bit (a NaN equals itself, -0.0 differs from 0.0, complex included)."""
    return t.reshape(-1).contiguous().view(torch.uint8)


def differences(before: dict, after: dict) -> list[str]:
    """What changed, one line each: a module's mode, a tensor gone or new, its dtype, device or bits."""
    out = [f"{n or 'model'}: training {m} -> {after['modes'].get(n)}" for n, m in before["modes"].items()
           if after["modes"].get(n) != m]
    for n, t in before["tensors"].items():
        u = after["tensors"].get(n)
        if u is None:
            out.append(f"{n}: gone")
        elif (u.dtype, u.device, u.shape) != (t.dtype, t.device, t.shape):
            out.append(f"{n}: {t.dtype} {tuple(t.shape)} on {t.device} -> {u.dtype} {tuple(u.shape)} on {u.device}")
        elif not torch.equal(_bits(t), _bits(u)):
            out.append(f"{n}: values changed")
    out += [f"{n}: new" for n in after["tensors"] if n not in before["tensors"]]
    return out


def probe(target: str) -> dict:
    model = resolve(target).double().train()
    complex_buffers = sorted(n for n, b in model.named_buffers() if b.is_complex())
    before = state(model)
    result = examine(model, name=target)
    changed = differences(before, state(model))
    return {"unchanged": not changed, "differences": changed, "complex_buffers": complex_buffers,
            "exit_code": result.exit_code}


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1])))
