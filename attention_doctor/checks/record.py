"""One record per check, as PyTorch's OpInfo has one per operator: the function and everything
said about it. The order the checks run in, their count, the docs table (docs/doctor.md) and the
rows' experiment and thread are derived from these records (attention_doctor.checks.REGISTRY),
never typed twice."""
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Check:
    """A check of the doctor.

    fn: ctx -> Row, the check itself (its name is the check's name); does: what it runs on the
    target; fails_when: what makes it fail; tolerance: its tolerance and why that value;
    applies: where it applies (elsewhere `n/a`, saying what would enable it); thread: the public
    thread where the failure shipped (owner/repo #N); targets: the catalogue experiments
    (conf/exp/NAME.yaml) whose failure value it targets, the first shown as `+exp=NAME`; causes:
    {cause: what it means} for the `cause` its fail and warn rows name."""
    fn: Callable
    does: str
    fails_when: str
    tolerance: str
    applies: str
    thread: str
    targets: tuple[str, ...] = ()
    causes: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.fn.__name__

    @property
    def experiment(self) -> str:
        """The catalogue experiment that reproduces this check's failure ("" if none)."""
        return self.targets[0] if self.targets else ""
