"""The doctor's signals: how an adapter, a check or the doctor's own instrumentation says that an
outcome other than a measured one applies. They derive from BaseException, as pytest's
OutcomeException does, so that no `except Exception` on the way (the target's own, an adapter's,
the doctor's) can swallow them; examine() turns each into its row (Signal.row_fields). Torch-free.

    Unsupported    n/a           the target lacks the capability by nature (raised by adapters)
    Unreachable    inconclusive  it may have it; the doctor cannot drive it (raised by adapters)
    TargetRaised   fail          the target's own code raised on a valid input (the doctor's wrapper
                                 around the target's forward raises it, never an adapter)
    NotPerformed   inconclusive  the check, or a part of it, could not be performed (its cause says why)
    DoctorBug      inconclusive  the doctor's own code raised (a built-in adapter's, a probe's, a hook's)
    AdapterError   inconclusive  a user-written Adapter's own code raised outside the target's forward

TargetError is no signal: an ordinary Exception, the target cannot be used at all (exit 2).
"""
import functools

from attention_doctor.result import Outcome


class TargetError(Exception):
    """The doctor cannot use the target at all, or an optional dependency is missing: one line
    that names the fix (the CLI exits 2 with it)."""


def said(e: BaseException, n: int = 300) -> str:
    """An exception in one line: its type and the first line of its message."""
    msg = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {msg}"[:n] if msg else type(e).__name__


class Signal(BaseException):
    """An outcome said by raising: `why` (the row's reason, or its detail for a fail), `cause`
    (a name from the check's record or the common causes), `measurements` (named values the row
    carries)."""
    outcome = Outcome.INCONCLUSIVE
    cause = ""

    def __init__(self, why: str = "", cause: str | None = None, measurements: dict | None = None):
        super().__init__(why)
        self.why = why
        if cause is not None:
            self.cause = cause
        self.measurements = dict(measurements or {})

    def row_fields(self) -> dict:
        """The fields of the row this signal becomes (examine adds the check's name and record)."""
        return {"outcome": self.outcome, "reason": self.why, "cause": self.cause,
                "measurements": dict(self.measurements)}


class Unsupported(Signal):
    """The target lacks, by nature, what a check needs (no KV cache, no padding mask): the check
    says `n/a: why`. Say in `why` what would enable it, e.g. "needs a padding mask (forward takes
    no attention_mask)"; `cause` is one of the common n/a causes (docs/doctor.md), `unsupported`
    when not given."""
    outcome = Outcome.NA
    cause = "unsupported"


class Unreachable(Unsupported):
    """The target may have what a check needs, but the doctor cannot drive it (a cache of its own
    kind, positions it rejects): the check says `inconclusive: why` (exit code 3), never n/a."""
    outcome = Outcome.INCONCLUSIVE
    cause = "unreachable"


class NotPerformed(Signal):
    """The check, or a part of it, could not be performed (cause: part_not_run, not_repeatable,
    scores_unseen, reference_nonfinite, ...): inconclusive, never a pass. A check that catches it
    for a part keeps what ran and names the part (`measurements["not_run"]`)."""
    cause = "part_not_run"


class TargetRaised(Signal):
    """The target's own forward (prefill, step) raised on an input a check gave it (a valid one):
    the check fails with cause target_raised. Raised only by the doctor's wrapper around the
    target's module (adapters.target_scope); `error` is the target's exception in one line;
    `asserted`: it was the target's own `assert` (a contract its author wrote, such as the dtype it
    runs in), not an error of its computation."""
    outcome = Outcome.FAIL
    cause = "target_raised"

    def __init__(self, error: BaseException):
        self.error = said(error)
        self.asserted = isinstance(error, AssertionError)
        super().__init__(self.error, measurements={"error": self.error})

    def row_fields(self) -> dict:
        return {**super().row_fields(), "reason": "", "detail": f"the target raised on a valid input: {self.error}"}


class Raised(Signal):
    """Code other than the target's raised (the base of DoctorBug and AdapterError): `error` is
    the exception in one line; examine(strict=True) re-raises the original (`__cause__`)."""
    label = ""

    def __init__(self, error: BaseException, where: str = ""):
        self.error = said(error, 200)
        super().__init__(f"{self.label} ({self.error})" + (f" in {where}" if where else ""),
                         measurements={"error": self.error})


class DoctorBug(Raised):
    """The doctor's own code raised (a built-in adapter outside the target's forward, a probe or a
    hook inside it): inconclusive, cause doctor_error."""
    cause, label = "doctor_error", "doctor error"


class AdapterError(Raised):
    """A user-written Adapter's own code raised outside the target's forward: inconclusive, cause
    adapter_error (the adapter is the user's code: neither a doctor bug nor the target's failure)."""
    cause, label = "adapter_error", "the adapter raised"


def doctor_hook(fn):
    """fn, a hook or function of the doctor's that runs inside the target's forward, with what it
    raises made a DoctorBug: it passes through the wrapper around the target's forward, which
    would otherwise read it as the target's own exception."""
    @functools.wraps(fn)
    def hook(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Signal:
            raise
        except Exception as e:  # noqa: BLE001 -- the doctor's hook raised: DoctorBug (inconclusive: doctor error), never the target's
            raise DoctorBug(e, getattr(fn, "__qualname__", "a hook")) from e
    return hook
