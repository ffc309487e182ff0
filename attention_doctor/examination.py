"""examine(): run the checks on a target and return a DoctorResult.

The outcomes are decided by structure: a check returns its row, or a signal says which outcome
applies (attention_doctor/signals.py: n/a, inconclusive, or a fail where the target's own forward
raised), and an exception that is none of these is the doctor's own code raising (inconclusive:
doctor error). Every check reads the target's description, decided once before any check runs."""
import time
import traceback
from dataclasses import asdict

import torch

from attention_doctor.baseline import of as of_baseline
from attention_doctor.checks import BY_NAME, ORDER, REGISTRY
from attention_doctor.checks.causality import describe
from attention_doctor.checks.common import Context
from attention_doctor.dispatch import adapt
from attention_doctor.module_state import restored
from attention_doctor.result import RAN, DoctorResult, Row
from attention_doctor.sensitivity import fill_zero_matrices, moves_later_outputs
from attention_doctor.signals import DoctorBug, Raised, Signal, TargetError, TargetRaised, Unsupported, said

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(d):
    if isinstance(d, torch.dtype):
        return d
    if d not in DTYPES:
        raise TargetError(f"--dtype {d!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[d]


def examine(target, *, causal=None, device="cpu", dtype=torch.float32, checks=None, seed=0, T=16,
            name=None, strict=False, baseline=None) -> DoctorResult:
    """Run the doctor's checks on `target` (a torch module, or an Adapter) and return the result.

    causal: for a layer, True/False if known, None to let the doctor find out (LMs are causal).
    device, dtype: where and in what precision the checks run (low_precision and long_positions
    add float16/bfloat16/float64 copies of their own). checks: the names of the checks to run,
    run in the registry's order whatever the order given (default: all; docs/doctor.md lists
    them; an unknown name is a TargetError); each gives the same outcome alone as in a full run.
    seed: the inputs' seed; T: the sequence length. name: the result's target name. strict:
    re-raise the doctor's own errors and an adapter's (default: the check is `inconclusive: doctor
    error (...)`, or `adapter_error`, never a pass). baseline: the expected outcomes the result is
    judged against (a file path, a dict or an attention_doctor.baseline.Baseline; its exit code,
    summary and assert_healthy follow it). Raises TargetError when the target cannot be used at all
    (or the baseline cannot be read).
    """
    wanted = ORDER if checks is None else list(checks)
    unknown = [c for c in wanted if c not in BY_NAME]
    if unknown:
        raise TargetError(f"unknown check(s) {', '.join(unknown)}; the checks: {', '.join(ORDER)}")
    try:
        adapter = adapt(target, causal=causal) if causal is not None else adapt(target)
    except TargetError:
        raise
    except Exception as e:  # noqa: BLE001 -- an adapter that cannot read the target: TargetError (exit 2, one line), no traceback
        if strict:
            raise
        raise TargetError(f"cannot drive {type(target).__name__}: {said(e)}") from None
    want = _dtype(dtype)
    try:
        expected = of_baseline(baseline)
    except ValueError as e:
        raise TargetError(str(e)) from None
    threads = torch.get_num_threads()   # describe() may run the checks on one thread
    with torch.random.fork_rng(devices=_cuda_devices()):   # the caller's RNG streams as they were
        try:
            torch.manual_seed(seed)   # what the target draws itself (its own init, a sampled mask): the same each run
            adapter = _own_copy(adapter, device, want, strict)
            adapter.module.eval()
            result = _examined(adapter, wanted, name, T, seed, strict)
            result.baseline = expected
            return result
        finally:
            torch.set_num_threads(threads)


def _cuda_devices():
    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


def _own_copy(adapter, device, dtype, strict):
    """The adapter on a copy of its module in device / dtype: the checks run on the copy, so the
    caller's model keeps its mode, dtype, device, parameters, buffers and caches; complex buffers
    stay complex (adapters.moved)."""
    try:
        return adapter.converted(dtype=dtype, device=torch.device(device))
    except (RuntimeError, ValueError, TypeError, AssertionError) as e:
        # the target's own limit (a device it cannot be moved to, a dtype its code refuses), said as such
        if strict:
            raise
        raise TargetError(f"the target cannot be copied to {device}/{str(dtype).replace('torch.', '')}: "
                          f"{said(e)}") from None


def _examined(adapter, wanted, name, T, seed, strict) -> DoctorResult:
    ctx = Context(adapter, T=T, seed=seed)
    _sensitive_first(ctx)
    blocked = _prepare(ctx, strict)
    x, y, raised = _smoke(ctx, strict)
    blocked = blocked or raised
    if blocked is None:
        y = _sensitive(ctx, x, y, strict)
        ctx.description = describe(ctx, x, y)
    result = DoctorResult(name or adapter.name, info={
        "kind": adapter.kind, "implementation": adapter.implementation,
        "attention_calls": None if blocked else _calls_seen(ctx, strict),
        "device": str(adapter.device), "dtype": str(adapter.dtype).replace("torch.", ""),
        "attention_modules": len(ctx.modules), "qk_sites": None if blocked else _sites(ctx, strict),
        "torch": torch.__version__})
    if ctx.description is not None:
        result.info["description"] = asdict(ctx.description)
    if getattr(adapter, "conventions", None):
        result.info["conventions"] = dict(adapter.conventions)
    timings = {}
    for rec in REGISTRY:
        if rec.name not in wanted:
            continue
        t0 = time.perf_counter()
        with restored(adapter.module):
            r = _row(rec, blocked) if blocked is not None else _check(rec, ctx, strict)
        timings[rec.name] = round(time.perf_counter() - t0, 3)
        result.checks.append(r)
    result.info.update(ctx.info)
    result.info["seconds"] = timings
    result.info["checks_run"] = sum(r.outcome in RAN for r in result.checks)   # not n/a, not inconclusive
    result.info["checks_total"] = len(result.checks)
    return result


def _check(rec, ctx, strict) -> Row:
    """One check's row: what it returned, or the row of the signal it raised; anything else it
    raised is the doctor's own code: inconclusive, doctor_error."""
    try:
        r = rec.fn(ctx)
    except Signal as s:
        if strict and isinstance(s, Raised):
            raise s.__cause__ or s
        return _row(rec, s)
    except Exception as e:  # noqa: BLE001 -- the check's own code raised: inconclusive (doctor_error), never a pass; strict re-raises it
        if strict:
            raise
        return _row(rec, DoctorBug(e), detail=traceback.format_exc(limit=-3))
    return _recorded(rec, r, strict)


def _row(rec, s: Signal, detail="") -> Row:
    """The row a signal makes for the check `rec`."""
    f = s.row_fields()
    return _recorded(rec, Row(rec.name, f["outcome"], f["reason"], f["cause"], measurements=f["measurements"],
                              detail=f.get("detail", detail)), False)


def _recorded(rec, r: Row, strict) -> Row:
    """r with its check's name, experiment and thread; a cause or a measurement the record does not
    declare (or a cause of another outcome) is a doctor bug: said in the detail, raised under strict."""
    r.name, r.experiment, r.thread = rec.name, rec.experiment, rec.thread
    cause = rec.cause(r.cause) if r.cause else None
    wrong = []
    if r.cause and (cause is None or cause.outcome != r.outcome):
        wrong.append(f"cause {r.cause!r} is not declared for a {r.outcome} row")
    wrong += [f"measurement {k!r} is not declared" for k in r.measurements if rec.measure(k) is None]
    if wrong:
        if strict:
            raise ValueError(f"{rec.name}: " + "; ".join(wrong) + " (its record, attention_doctor/checks/catalogue.py)")
        r.detail += " (" + "; ".join(wrong) + ": a doctor bug)"
    return r


def _prepare(ctx, strict) -> Signal | None:
    """The adapter's prepare() on a sample input. A forward that raises is the smoke test's to
    report; the adapter's own code raising leaves every check inconclusive (the signal returned),
    since what it was to find is not known."""
    try:
        ctx.call(ctx.adapter.prepare, ctx.sample(k=99))
    except TargetRaised as e:
        ctx.info["conventions_error"] = e.error[:200]
    except Signal as e:   # the adapter's own code raised, or its prepare said a row for every check
        if strict and isinstance(e, Raised):
            raise e.__cause__ or e
        e.why = f"{e.why} while preparing the target"
        return e
    return None


def _smoke(ctx, strict):
    """One plain forward: (the input, its output, None). A target whose forward cannot be called
    or returns no (B, T, D) floating tensor is a TargetError (exit 2), not a failed check; the
    adapter's own code raising around it is no fault of the target's: (x, None, the signal), and
    every check is inconclusive with it."""
    x = ctx.sample()
    try:
        y = ctx.run(x)
    except TargetRaised as e:
        y = _masked_smoke(ctx, x)   # raising with no mask only: the checks that call it so fail (target_raised)
        if y is None:
            raise TargetError(f"{ctx.adapter.name}: its forward raised on a ({ctx.B}, {ctx.T}) input: {e.error}") from None
        ctx.info["unmasked_forward_raised"] = e.error[:200]
    except Unsupported as e:   # no plain call at all
        raise TargetError(f"{ctx.adapter.name}: {e.why}") from None
    except Signal as e:   # the adapter's own code raised (or said a row for every check) around the forward
        if strict and isinstance(e, Raised):
            raise e.__cause__ or e
        e.why = f"{e.why} on a plain ({ctx.B}, {ctx.T}) input"
        return x, None, e
    if not isinstance(y, torch.Tensor) or not y.is_floating_point() or y.dim() != 3 or y.shape[:2] != x.shape[:2]:
        shape = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise TargetError(f"{ctx.adapter.name}: forward returned {shape}, not ({ctx.B}, {ctx.T}, D) floats")
    return x, y, None


def _masked_smoke(ctx, x):
    """The plain forward with an all-ones mask, where the one without a mask raised: its output, or
    None where that raises too (or the target takes no mask). A target that runs only when given a
    mask is examined, and what it raises without one is the failure of each check that calls it so."""
    try:
        return ctx.run(x, torch.ones(x.shape[:2], dtype=torch.bool, device=x.device))
    except Signal:   # raises with a mask too, or takes none: the target cannot be used (TargetError)
        return None


def _sensitive_first(ctx):
    """Before the conventions are found (prepare: a mask's encoding, a cache, positions, each by what
    moves the outputs), the copy's outputs made able to move (_sensitive) where a plain forward runs
    already: found on outputs that cannot move, each would be read as ignored. Where the plain
    forward needs what prepare finds, _sensitive does it after the smoke test."""
    x = ctx.sample()
    try:
        y = ctx.run(x)
    except Signal:   # it needs its conventions first (gpt-fast's input_pos), or raises: the smoke test says
        return
    _sensitive(ctx, x, y, strict=False)
    ctx.info.pop("insensitive_outputs", None)   # decided after the smoke test, on the conventions found


def _sensitive(ctx, x, y, strict):
    """The plain output y, after making the copy's outputs able to show the attention (sensitivity.py):
    all-zero weight matrices filled where no later output moves with position 0 (info says which);
    info["insensitive_outputs"] where they still do not."""
    if ctx.T < 2:
        return y
    try:
        if moves_later_outputs(ctx, x, y):
            return y
        filled = []
        for gates in (False, True):   # the matrices first; the zero gates only where they leave the outputs still
            more = fill_zero_matrices(ctx.adapter.module, ctx.seed, gates=gates)
            if more:
                filled += more
                y = ctx.run(x)
                if moves_later_outputs(ctx, x, y):
                    break
        if filled:
            ctx.info["filled_zero_weights"] = filled
        if not filled or not moves_later_outputs(ctx, x, y):
            ctx.info["insensitive_outputs"] = True
    except Signal as s:   # the target raised or the adapter did: the checks that run it say so
        if strict and isinstance(s, Raised):
            raise s.__cause__ or s
    return y


def _calls_seen(ctx, strict) -> dict | None:
    """{source: count} of the attention calls one plain forward shows the doctor (sdpa, flex, softmax,
    this project's recorder); {} when it sees none. None if the probe itself failed."""
    try:
        _, calls = ctx.probe(ctx.sample(k=1))
    except Signal as s:   # the checks that probe report it
        if strict and isinstance(s, Raised):
            raise s.__cause__ or s
        return None
    out = {}
    for c in calls:
        out[c.source] = out.get(c.source, 0) + 1
    return out


def _sites(ctx, strict) -> int | None:
    """How many q/k sites were verified (None: finding them raised; the checks that need them say so)."""
    try:
        return len(ctx.sites())
    except Signal as s:
        if strict and isinstance(s, Raised):
            raise s.__cause__ or s
        return None
