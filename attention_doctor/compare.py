"""What changed between two results: one row's move from OLD to NEW classified once, for a
maintainer's two runs (`attention-doctor --against OLD.json NEW.json`) and for the zoo's sentinel
between two releases (doctor_lab/zoo/sentinel.py). Torch-free.

    new_fail       a fail or warn in NEW where OLD passed or was n/a (or had no row)
    new_blind      an inconclusive row in NEW where OLD's was not
    fixed          a fail or warn in OLD that passes (or is n/a) in NEW
    cause_changed  flagged in both, with another outcome or cause
    gone           a row of OLD that NEW lacks"""
from dataclasses import dataclass

from attention_doctor.result import FAIL, INCONCLUSIVE, NA, PASS, WARN, DoctorResult, Row

FLAGGED = (FAIL, WARN)
KINDS = ("new_fail", "new_blind", "fixed", "cause_changed", "gone")
TITLES = {"new_fail": "new fail or warn", "new_blind": "new inconclusive", "fixed": "fixed",
          "cause_changed": "outcome or cause changed", "gone": "not examined in NEW"}


def classify(old: Row | None, new: Row | None) -> str | None:
    """The kind of change from `old` to `new` (None: nothing a reader must see)."""
    was_flagged = old is not None and old.outcome in FLAGGED
    if new is None:
        return "gone" if old is not None else None
    if new.outcome in FLAGGED and not was_flagged:
        return "new_fail"
    if new.outcome is INCONCLUSIVE and (old is None or old.outcome is not INCONCLUSIVE):
        return "new_blind"
    if was_flagged and new.outcome in (PASS, NA):
        return "fixed"
    if was_flagged and (old.outcome, old.cause) != (new.outcome, new.cause):
        return "cause_changed"
    return None


@dataclass
class Moved:
    """One check whose row moved: its kind (KINDS), the OLD and NEW rows (None: absent)."""
    check: str
    kind: str
    old: Row | None
    new: Row | None


def between(old: DoctorResult, new: DoctorResult) -> list[Moved]:
    """Each check whose row moved from result `old` to `new`, in NEW's order, then OLD's rows NEW lacks."""
    a, b = {r.name: r for r in old.checks}, {r.name: r for r in new.checks}
    names = list(b) + [n for n in a if n not in b]
    return [Moved(n, k, a.get(n), b.get(n)) for n in names if (k := classify(a.get(n), b.get(n)))]


def _said(r: Row | None) -> str:
    return "-" if r is None else r.outcome.value + (f" ({r.cause})" if r.cause else "")


def render(old: DoctorResult, new: DoctorResult) -> str:
    """What changed, as text for a terminal or a pull request: one line per moved check."""
    moved = between(old, new)
    head = f"attention doctor: {new.target} against {old.target}: "
    if not moved:
        return head + f"nothing changed ({len(new.checks)} checks)"
    counts = ", ".join(f"{sum(m.kind == k for m in moved)} {TITLES[k]}" for k in KINDS if any(m.kind == k for m in moved))
    w = max(len(m.check) for m in moved)
    return "\n".join([head + counts] + [f"{m.check.ljust(w)}  {_said(m.old)} -> {_said(m.new)}  ({TITLES[m.kind]})"
                                        for m in moved])
