"""examine(): run the checks on a target and return a DoctorResult."""
import time
import traceback

import torch

from attention_doctor import checks as registry
from attention_doctor.adapters import TargetError
from attention_doctor.checks.common import COMMON_CAUSES, Context, TargetRaised, inconclusive, row
from attention_doctor.dispatch import adapt
from attention_doctor.result import FAIL, PASS, WARN, DoctorResult

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(d):
    if isinstance(d, torch.dtype):
        return d
    if d not in DTYPES:
        raise TargetError(f"--dtype {d!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[d]


def examine(target, *, causal=None, device="cpu", dtype=torch.float32, checks=None, seed=0, T=16,
            name=None, strict=False) -> DoctorResult:
    """Run the doctor's checks on `target` (a torch module, or an Adapter) and return the result.

    causal: for a layer, True/False if known, None to let the doctor find out (LMs are causal).
    device, dtype: where and in what precision the checks run (low_precision and long_positions
    add float16/bfloat16/float64 copies of their own). checks: the names of the checks to run,
    run in the registry's order whatever the order given (default: all; docs/doctor.md lists
    them; an unknown name is a TargetError); without eval_dropout the others take the target's
    eval outputs as repeatable. seed: the inputs' seed; T: the sequence length. name: the
    result's target name. strict: re-raise the doctor's own errors (default: the check is
    `inconclusive: doctor error (...)`, never a pass). Raises TargetError when the target cannot
    be used at all.
    """
    wanted = registry.ORDER if checks is None else list(checks)
    unknown = [c for c in wanted if c not in registry.BY_NAME]
    if unknown:
        raise TargetError(f"unknown check(s) {', '.join(unknown)}; the checks: {', '.join(registry.ORDER)}")
    try:
        adapter = adapt(target, causal=causal) if causal is not None else adapt(target)
    except TargetError:
        raise
    except Exception as e:   # an adapter that cannot read the target: one line, not a traceback
        if strict:
            raise
        raise TargetError(f"cannot drive {type(target).__name__}: {type(e).__name__}: {e}"[:300]) from None
    try:
        adapter.module.to(device=torch.device(device), dtype=_dtype(dtype))
    except (RuntimeError, ValueError) as e:
        raise TargetError(f"cannot move the target to {device}/{dtype}: {e}") from None
    adapter.module.eval()
    ctx = Context(adapter, T=T, seed=seed)
    if adapter.kind == "lm":
        ctx.causal = True
    elif adapter.causal is not None:
        ctx.causal = adapter.causal
    try:
        adapter.prepare(ctx.sample(k=99))
    except Exception as e:   # a forward that raises is the smoke test's to report
        ctx.info["conventions_error"] = f"{type(e).__name__}: {str(e)[:160]}"
    _smoke(ctx)
    result = DoctorResult(name or adapter.name, info={
        "kind": adapter.kind, "implementation": adapter.implementation, "attention_calls": _calls_seen(ctx, strict),
        "device": str(adapter.device), "dtype": str(adapter.dtype).replace("torch.", ""),
        "attention_modules": len(ctx.modules), "qk_sites": len(ctx.sites()), "torch": torch.__version__})
    if getattr(adapter, "conventions", None):
        result.info["conventions"] = dict(adapter.conventions)
    timings = {}
    for rec in registry.REGISTRY:
        n = rec.name
        if n not in wanted:
            continue
        t0 = time.perf_counter()
        try:
            r = rec.fn(ctx)
        except TargetRaised as e:
            r = row(n, "fail", None, "", f"the target raised on a valid input: {e}", "target_raised")
        except Exception as e:
            if strict:
                raise
            r = inconclusive(n, f"doctor error ({type(e).__name__}: {e})"[:200], "doctor_error",
                             detail=traceback.format_exc(limit=-3))
        r.experiment, r.thread = rec.experiment, rec.thread
        if r.cause and r.cause not in rec.causes and r.cause not in COMMON_CAUSES:   # a doctor bug: said, kept
            if strict:
                raise ValueError(f"{n}: cause {r.cause!r} is not in its record's causes nor COMMON_CAUSES")
            r.detail += f" (cause {r.cause!r} is not registered: a doctor bug)"
        timings[n] = round(time.perf_counter() - t0, 3)
        result.checks.append(r)
    result.info.update(ctx.info)
    result.info["seconds"] = timings
    result.info["checks_run"] = sum(r.outcome in (PASS, FAIL, WARN) for r in result.checks)   # not n/a, not inconclusive
    result.info["checks_total"] = len(result.checks)
    return result


def _calls_seen(ctx, strict) -> dict | None:
    """{source: count} of the attention calls one plain forward shows the doctor (sdpa, softmax,
    this project's recorder); {} when it sees none. None if the probe itself failed."""
    try:
        _, calls = ctx.probe(ctx.sample(k=1))
    except TargetRaised:
        return None
    except Exception:
        if strict:
            raise
        return None
    out = {}
    for c in calls:
        out[c.source] = out.get(c.source, 0) + 1
    return out


def _smoke(ctx):
    """One plain forward: a target whose forward cannot be called or returns no (B, T, D)
    floating tensor is a TargetError (exit 2), not a failed check."""
    x = ctx.sample()
    try:
        y = ctx.run(x)
    except TargetRaised as e:
        raise TargetError(f"{ctx.adapter.name}: its forward raised on a ({ctx.B}, {ctx.T}) input: {e}") from None
    except Exception as e:  # Unsupported on a plain call
        raise TargetError(f"{ctx.adapter.name}: {e}") from None
    if not isinstance(y, torch.Tensor) or not y.is_floating_point() or y.dim() != 3 or y.shape[:2] != x.shape[:2]:
        shape = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise TargetError(f"{ctx.adapter.name}: forward returned {shape}, not ({ctx.B}, {ctx.T}, D) floats")
