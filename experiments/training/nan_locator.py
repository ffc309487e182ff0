"""Where a NaN/inf came from: rerun the step's forward and name the first module (in execution
order) whose output is not finite; the softmax inside attention is not a module, so a Recorder
checking the weights names it (`blocks.0.attn.softmax[naive]`). If the forward is finite, the
first parameter whose gradient is not."""
import torch

from attention.diagnostics import Recorder


def first_nonfinite_module(model, batch, amp) -> str | None:
    rec = Recorder(stats=False, check_finite=True)  # a recorder forces the explicit path: SDPA hides the weights
    softmax_of = {m.name: f"{n}.softmax[{m.cfg.softmax}]" for n, m in model.named_modules() if m in model.attentions}
    found = []

    def note(name, out):
        if found:
            return
        if rec.nonfinite:  # the softmax ran before this module's output was complete
            found.append(softmax_of[rec.nonfinite[0]])
            return
        t = out[0] if isinstance(out, tuple) else out
        if torch.is_tensor(t) and not torch.isfinite(t).all():
            found.append(name)

    handles = [m.register_forward_hook(lambda mod, inp, out, n=n: note(n, out)) for n, m in model.named_modules() if n]
    try:
        with torch.no_grad(), amp():
            for a in model.attentions:
                a.recorder = rec
            model(batch.x, key_padding_mask=batch.key_padding_mask)
    finally:
        for h in handles:
            h.remove()
        for a in model.attentions:
            a.recorder = None
    if not found and rec.nonfinite:
        found.append(softmax_of[rec.nonfinite[0]])
    return found[0] if found else None


def locate(model, batch, amp, loss) -> dict:
    """{module, where} of a non-finite loss or gradient norm."""
    where = "forward" if not torch.isfinite(loss) else "backward"
    module = first_nonfinite_module(model, batch, amp)
    if module is None:  # the forward is finite: name the first parameter whose gradient is not
        module = next((n for n, p in model.named_parameters()
                       if p.grad is not None and not torch.isfinite(p.grad).all()), None)
    return {"module": module, "where": where}
