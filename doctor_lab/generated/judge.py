"""One combination's rows against its expected outcome: right, or a miss of one kind (typed, never
prose another module parses). Torch-free: it reads the doctor's rows as (outcome, cause) pairs."""
from dataclasses import dataclass

from doctor_lab.generated.combos import Expected

# the kinds of miss, in the order they are looked for
ERROR, FALSE_ALARM, MISSED, OTHER_CAUSE, NOT_NA = "error", "false_alarm", "missed", "other_cause", "not_na"
KINDS = (ERROR, FALSE_ALARM, MISSED, OTHER_CAUSE, NOT_NA)
SANITY = ("finite_output",)   # run on every combination beside its expected checks


@dataclass(frozen=True)
class Miss:
    kind: str
    check: str
    got: str        # the row as `outcome (cause)`, or the error

    def to_dict(self) -> dict:
        return {"kind": self.kind, "check": self.check, "got": self.got}


def row_text(outcome: str, cause: str) -> str:
    return f"{outcome} ({cause})" if cause else outcome


def judge(expected: Expected, rows: dict[str, tuple[str, str]], error: str = "") -> Miss | None:
    """None when the rows are the expected outcome. rows: check -> (outcome, cause) of every check
    examined. A doctor error (an inconclusive naming one) is a miss wherever it is."""
    if error:
        return Miss(ERROR, "", error)
    for check, (outcome, cause) in rows.items():
        if outcome == "inconclusive" and cause in ("doctor_error", "adapter_error"):
            return Miss(ERROR, check, row_text(outcome, cause))
    if not expected.rows:   # healthy: no check may fail
        for check, (outcome, cause) in rows.items():
            if outcome == "fail":
                return Miss(FALSE_ALARM, check, row_text(outcome, cause))
    for e in expected.rows:
        outcome, cause = rows.get(e.check, ("missing", ""))
        if outcome != e.outcome:
            return Miss(MISSED, e.check, row_text(outcome, cause))
        if cause not in e.causes:
            return Miss(OTHER_CAUSE, e.check, row_text(outcome, cause))
    for check in expected.na:
        outcome, cause = rows.get(check, ("n/a", ""))
        if outcome != "n/a":
            return Miss(NOT_NA, check, row_text(outcome, cause))
    return None
