"""What the backtest runs for one entry of the record: which doctor checks (the entry's own, or, for
an entry whose check is a probe the doctor lacks, the nearest checks it has), on which releases
(before, introduced, fixed; not "open"), and where each release's zoo run goes."""
from dataclasses import dataclass
from pathlib import Path

from doctor_lab.backtest import record as rec
from doctor_lab.backtest import releases

ROLES = ("before", "introduced", "fixed")
# a probe the doctor lacks -> the checks it has that come nearest (run so that "missed" is measured,
# not assumed: if one of them flags the regression, the record's check is wrong)
NEAREST: dict[str, tuple[str, ...]] = {}


@dataclass(frozen=True)
class Plan:
    entry: rec.Regression
    checks: tuple[str, ...]     # what the zoo runs (empty: nothing runs)
    nearest: bool               # checks are NEAREST's, not the entry's own
    options: bool = False       # the option zoo's rows (every option set found), not the entry's config

    @property
    def config(self) -> tuple:
        """The values the entry gives the zoo's configs; none under the option zoo, which finds them."""
        return () if self.options else self.entry.config

    @property
    def releases(self) -> dict[str, str]:
        """role -> release, in order (a fix still "open" is no release)."""
        e = self.entry
        return {role: v for role, v in zip(ROLES, (e.before, e.introduced, e.fixed)) if v != rec.OPEN}

    @property
    def impls(self) -> tuple[str, ...]:
        return tuple(i.value for i in self.entry.implementations)


def is_probe(entry: rec.Regression, registered: frozenset[str]) -> bool:
    """The entry's check is a probe the doctor lacks (record.PROBES), not one of its checks."""
    return entry.check not in registered


def plan(entry: rec.Regression, registered: frozenset[str], nearest: bool = True, options: bool = False) -> Plan:
    if entry.library != releases.TRANSFORMERS:   # the backtest drives transformers' zoo: nothing runs (not run)
        return Plan(entry, (), is_probe(entry, registered), options)
    if not is_probe(entry, registered):
        return Plan(entry, (entry.check,), False, options)
    return Plan(entry, NEAREST.get(entry.check, ()) if nearest else (), True, options)


OPTIONS = "@options"   # a run dir of the option zoo (python -m doctor_lab.zoo --options)


def run_dir(root: Path, release: str, checks: tuple[str, ...], config: tuple = (), options: bool = False) -> Path:
    """One zoo output dir per release, set of checks and config values (or the option zoo's): a result
    of other checks is stale to the zoo (its run key names them), so entries that share a release but
    not their checks (or the values they give the configs) never redo each other's runs."""
    return Path(root) / release / ("+".join(checks) + "".join(f"@{k}={v}" for k, v in config) + (OPTIONS if options else ""))
