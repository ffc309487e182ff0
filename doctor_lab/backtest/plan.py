"""What the backtest runs for one entry of the record: which doctor checks (the entry's own, or, for
an entry whose check is a probe the doctor lacks, the nearest checks it has), on which releases
(before, introduced, fixed; not "open"), through which zoo (the entry's library's: ZOOS), on which of
its paths, and where each release's zoo run goes."""
from dataclasses import dataclass
from pathlib import Path

from doctor_lab.backtest import record as rec
from doctor_lab.backtest import releases

ROLES = ("before", "introduced", "fixed")
# a probe the doctor lacks -> the checks it has that come nearest (run so that "missed" is measured,
# not assumed: if one of them flags the regression, the record's check is wrong)
NEAREST: dict[str, tuple[str, ...]] = {}
# library -> the zoo that examines its targets (an entry's architectures are that zoo's targets: x-transformers'
# option names, diffusers' processor classes); transformers' zoo builds architectures by model type
ZOOS = {releases.TRANSFORMERS: "doctor_lab.zoo", "x-transformers": "doctor_lab.zoo_xt",
        "diffusers": "doctor_lab.zoo_diffusers"}
# library -> the record's implementation -> the paths of its zoo that run it (transformers': the same names).
# x-transformers' flash path is F.scaled_dot_product_attention, its einsum path its own softmax; a diffusers
# processor is one implementation (the class: AttnProcessor2_0 calls SDPA), examined as self- and cross-attention
PATHS = {"x-transformers": {"eager": ("einsum",), "sdpa": ("flash",)},
         "diffusers": {i: ("self", "cross") for i in ("eager", "sdpa", "flex_attention", "flash_attention_2")}}


@dataclass(frozen=True)
class Plan:
    entry: rec.Regression
    checks: tuple[str, ...]     # what the zoo runs (empty: nothing runs)
    nearest: bool               # checks are NEAREST's, not the entry's own
    options: bool = False       # the option zoo's rows (every option set found), not the entry's config
                                # (transformers only: the other zoos' targets are option sets already)

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
        """The paths of the entry's zoo its implementations run on (transformers': the implementations)."""
        wanted = (i.value for i in self.entry.implementations)
        if self.entry.library not in PATHS:
            return tuple(wanted)
        return tuple(dict.fromkeys(p for i in wanted for p in PATHS[self.entry.library][i]))

    @property
    def zoo(self) -> str:
        return ZOOS[self.entry.library]

    def release_dir(self, release: str) -> str:
        """The name of a release's directory under the runs (another library's prefixed: xt-2.17.0)."""
        return release_dir(release, self.entry.library)

    def run_dir(self, root: Path, release: str) -> Path:
        return run_dir(root, self.release_dir(release), self.checks, self.config, self.options)


def release_dir(release: str, library: str = releases.TRANSFORMERS) -> str:
    return release if library == releases.TRANSFORMERS else f"{releases.LIBRARIES[library][1]}-{release}"


def is_probe(entry: rec.Regression, registered: frozenset[str]) -> bool:
    """The entry's check is a probe the doctor lacks (record.PROBES), not one of its checks."""
    return entry.check not in registered


def plan(entry: rec.Regression, registered: frozenset[str], nearest: bool = True, options: bool = False) -> Plan:
    options = options and entry.library == releases.TRANSFORMERS
    if not is_probe(entry, registered):
        return Plan(entry, (entry.check,), False, options)
    return Plan(entry, NEAREST.get(entry.check, ()) if nearest else (), True, options)


OPTIONS = "@options"   # a run dir of the option zoo (python -m doctor_lab.zoo --options)


def run_dir(root: Path, release: str, checks: tuple[str, ...], config: tuple = (), options: bool = False) -> Path:
    """One zoo output dir per release (Plan.release_dir: another library's prefixed), set of checks and
    config values (or the option zoo's): a result of other checks is stale to the zoo (its run key names
    them), so entries that share a release but not their checks (or the values they give the configs)
    never redo each other's runs."""
    return Path(root) / release / ("+".join(checks) + "".join(f"@{k}={v}" for k, v in config) + (OPTIONS if options else ""))
