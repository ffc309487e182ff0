"""What the doctor said on each release of an entry, and the entry's verdict. A cell is one
architecture x implementation x check on one release, read from that release's zoo.json through the
doctor's own parser (Row.from_dict: outcome, reason, cause, measured; never the display verdict),
or, where there is no row, why not (the install, the zoo's refusal, the model's build). Torch-free.

Verdicts (one check, over its cells):
  caught               fail or warn on the introducing release for an architecture x implementation that
                       passes (or is n/a) on the release before and on the fix, or that does not exist there
                       (the zoo's status unsupported: the release lacked the implementation, so the bug too)
  caught, imprecise    each such hit fails or warns on the release before or on the fix as well
  caught, unbracketed  a hit whose release before or fix did not run or was inconclusive: unproven
  missed               the check ran on the introducing release and did not fail or warn
  not run              no row on the introducing release (never counted as caught)
An entry whose check is a probe the doctor lacks is `missed (needs probe X)`; the nearest checks it
has, where they ran, add what they said. An entry of another library is judged alike, from its own
zoo's rows (an architecture is that zoo's target, an implementation its path: plan.PATHS)."""
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from attention_doctor.result import FAIL, INCONCLUSIVE, WARN, Row
from doctor_lab.backtest import runner
from doctor_lab.backtest.plan import Plan
from doctor_lab.report.triage import row_name

CAUGHT, IMPRECISE, UNBRACKETED, MISSED, NOT_RUN = (
    "caught", "caught, imprecise", "caught, unbracketed", "missed", "not run")
EXAMINED, UNSUPPORTED = "examined", "unsupported"   # the zoo's statuses (doctor_lab.zoo.worker)


@dataclass(frozen=True)
class Cell:
    role: str
    release: str
    arch: str
    impl: str
    check: str
    row: Row | None
    not_run: str = ""     # why there is no row
    status: str = ""      # the zoo's status of the result (examined, unsupported, ...); "" without one
    options: str = ""     # the option zoo's option set (its label; "" the default config)

    @property
    def flagged(self) -> bool:
        return self.row is not None and self.row.outcome in (FAIL, WARN)

    @property
    def clean(self) -> bool:
        """Ran and did not flag: pass or n/a (an inconclusive row proves nothing)."""
        return self.row is not None and not self.flagged and self.row.outcome is not INCONCLUSIVE

    @property
    def absent(self) -> bool:
        """The release does not offer this implementation for this architecture: nothing to flag there."""
        return self.status == UNSUPPORTED

    @property
    def pair(self) -> str:
        return f"{row_name(self.arch, self.options)}/{self.impl}"

    def text(self) -> str:
        """'fail (new_tokens_differ, 0.281)', 'pass (2.67e-07)', 'n/a: why', 'not run: why'."""
        if self.row is None:
            return self.not_run if self.absent else f"not run: {self.not_run}"
        r = self.row
        said = ", ".join(x for x in (r.cause, measured(r.measured)) if x)
        return f"{r.outcome.value}" + (f": {r.reason}" if r.reason else "") + (f" ({said})" if said else "")

    def to_dict(self) -> dict:
        r = self.row
        d = {k: v for k, v in asdict(self).items() if k != "row"}
        m = r.measured if r else None
        if isinstance(m, float) and not math.isfinite(m):   # JSON has no NaN or inf
            m = str(m)
        d.update(outcome=r.outcome.value if r else "", reason=r.reason if r else "", cause=r.cause if r else "",
                 measured=m)
        return d


@dataclass(frozen=True)
class Verdict:
    kind: str
    text: str


def measured(x) -> str:
    if x is None:
        return ""
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def _results(out: Path) -> dict[tuple[str, str, str], dict]:
    """(arch, option set, impl) -> its result (option set '' for the default config)."""
    try:
        z = json.loads((Path(out) / "zoo.json").read_text())
    except (OSError, ValueError):
        return {}
    return {(r["arch"], r.get("option_label", ""), r["impl"]): r for r in z.get("results", [])}


def _no_result(root: Path, release: str, out: Path, arch: str) -> str:
    """Why an architecture has no result on a release: the install, the zoo's refusal, or no run yet."""
    err = runner.read_install_error(root, release)
    if err:
        return f"install failed: {err}"
    a = runner.read_attempt(out, arch)
    if a is None:
        return "not run yet"
    if a["rc"]:
        return f"the zoo exited {a['rc']}: {a['said']}"
    return "the zoo wrote no result"


def cell(role: str, release: str, arch: str, impl: str, check: str, result: dict | None, why: str,
         options: str = "") -> Cell:
    """The cell of one zoo result (None: `why` there is none)."""
    if result is None:
        return Cell(role, release, arch, impl, check, None, why, options=options)
    if result.get("status") != EXAMINED:
        return Cell(role, release, arch, impl, check, None,
                    f"{result.get('status')}: {' '.join(str(result.get('reason', '')).split())[:200]}",
                    result.get("status", ""), options)
    rows = [c for c in result.get("checks", []) if c.get("name") == check]
    if not rows:
        return Cell(role, release, arch, impl, check, None, f"the zoo's result has no {check} row", options=options)
    return Cell(role, release, arch, impl, check, Row.from_dict(rows[0]), status=EXAMINED, options=options)


def covered(p: Plan, root: Path) -> bool:
    """A run was made of each architecture of the plan on each of its releases: a result, or the attempt
    the backtest recorded (a zoo call that wrote none, as the option zoo on a release it cannot build)."""
    def ran(d: Path, arch: str) -> bool:
        return runner.read_attempt(d, arch) is not None or any(arch == a for a, _, _ in _results(d))
    return all(ran(p.run_dir(root, release), arch) for release in p.releases.values() for arch in p.entry.architectures)


def cells(p: Plan, root: Path) -> list[Cell]:
    """Every release x architecture (x option set, under the option zoo: each set any release examined)
    x implementation x check of the plan, from root/<release>/<checks>/."""
    out = []
    dirs = {role: p.run_dir(root, release) for role, release in p.releases.items()}
    results = {role: _results(d) for role, d in dirs.items()}
    for role, release in p.releases.items():
        for arch in p.entry.architectures:
            why = "" if any((arch, "", i) in results[role] for i in p.impls) else _no_result(root, p.release_dir(release), dirs[role], arch)
            sets = sorted({o for rs in results.values() for (a, o, _) in rs if a == arch} | {""})
            for o in sets:
                for impl in p.impls:
                    for check in p.checks:
                        r = results[role].get((arch, o, impl))
                        out.append(cell(role, release, arch, impl, check, r,
                                        why or ("the zoo wrote no result" if not o else "option set not examined here"), o))
    return out


def _grouped(cs: list[Cell]) -> str:
    """'kv_cache pass on gemma2/eager, gemma2/sdpa; not run: ... on t5/eager': one clause per text."""
    by: dict[str, list[str]] = {}
    for c in cs:
        by.setdefault(c.text(), []).append(c.pair)
    return "; ".join(f"{t} on {', '.join(ps)}" for t, ps in by.items())


def judge(cs: list[Cell], check: str) -> Verdict:
    """The verdict of one check over an entry's cells (the module docstring says what each means);
    its text says on which release and what the doctor said, without the check's name."""
    mine = [c for c in cs if c.check == check]
    intro = [c for c in mine if c.role == "introduced"]
    release = intro[0].release if intro else "?"
    if not any(c.row for c in intro):
        return Verdict(NOT_RUN, f"on {release}: {_grouped(intro)}")
    hits = [c for c in intro if c.flagged]
    if not hits:
        return Verdict(MISSED, f"on {release}: {_grouped([c for c in intro if c.row])}")
    precise, loose, unproven = [], [], []
    for h in hits:
        around = [c for c in mine if c.role != "introduced" and c.pair == h.pair]
        if any(c.flagged for c in around):
            loose.append((h, [c for c in around if c.flagged]))
        elif all(c.clean or c.absent for c in around):
            precise.append(h)
        else:
            unproven.append((h, [c for c in around if not (c.clean or c.absent)]))
    if precise:
        absent = sorted({f"{c.pair} on {c.release}" for h in precise for c in mine if c.pair == h.pair and c.absent})
        return Verdict(CAUGHT, f"on {release}: {_grouped(precise)}; clean before and after"
                       + (f" ({', '.join(absent)}: unsupported, the implementation did not exist)" if absent else ""))
    if loose:
        also = sorted({f"{c.release} ({c.role})" for _, around in loose for c in around})
        return Verdict(IMPRECISE, f"on {release}: {_grouped([h for h, _ in loose])}; also on {', '.join(also)}")
    what = sorted({f"{c.release} ({c.role}): {c.text()}" for _, around in unproven for c in around})
    return Verdict(UNBRACKETED, f"on {release}: {_grouped([h for h, _ in unproven])}; unproven: {'; '.join(what)}")


def verdict(p: Plan, cs: list[Cell]) -> Verdict:
    """The entry's verdict: its own check's, or `missed (needs probe X)` with what the nearest said."""
    if not p.nearest:
        v = judge(cs, p.entry.check)
        return Verdict(v.kind, f"{p.entry.check} {v.text}")
    said = [f"nearest {c}: {v.kind} {v.text}" for c, v in ((c, judge(cs, c)) for c in p.checks)]
    return Verdict(MISSED, f"needs probe {p.entry.check}" + ("; " + "; ".join(said) if said else
                                                             "; no nearest check run"))
