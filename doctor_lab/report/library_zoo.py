"""A library zoo's report section (doctor_lab/report/sections/zoo_xt.py, zoo_diffusers.py): what
`python -m doctor_lab.zoo_xt` / `doctor_lab.zoo_diffusers` wrote under results/<zoo>/ (one
directory per release), every row that is not a pass or n/a grouped into problems by the zoo's
triage (its triage.yaml), the targets not examined with why, the cost of the run, and, with more
than one release, the problems over releases with their picture. Pure Python, from committed JSON."""
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from doctor_lab.report import releases, triage
from doctor_lab.report.sections import zoo

ROOT = Path(__file__).resolve().parents[2]

# every row of a library zoo that is not a pass or n/a is a problem (its inconclusive rows too)
FLAGGED = ("fail", "warn", "inconclusive", "error")


@dataclass(frozen=True)
class Library:
    """One library zoo as its section shows it."""
    name: str            # the section's NAME (README markers lab:<name>, lab:<name>_summary)
    title: str           # the section's heading
    library: str         # the library's name in words
    results: str         # its directory under results/
    command: str         # the command that runs it
    about: str           # what the zoo builds, one paragraph (markdown)
    spec: triage.Spec    # its triage
    target: str = "target"

    def root(self, fig_dir: Path) -> Path:
        return Path(fig_dir).parent / self.results

    @property
    def figure(self) -> str:
        return f"{self.name}_releases.png"

    def blocks(self, runs, fig_dir: Path) -> dict[str, str]:
        """The section's blocks (the sections protocol: `blocks = LIBRARY.blocks`)."""
        return blocks(self, fig_dir)


def blocks(lib: Library, fig_dir: Path) -> dict[str, str]:
    """The section and its README line; none without a table."""
    z = zoo.current(lib.root(fig_dir))
    if not z:
        return {}
    return {lib.name: render(lib, z, fig_dir), f"{lib.name}_summary": summary(lib, z, fig_dir)}


def _per_path(z: dict) -> str:
    n = Counter(r["impl"] for r in z["results"] if r["status"] == "examined")
    return ", ".join(f"{i} {k}" for i, k in sorted(n.items()))


def _verdicts(ps: list[dict]) -> str:
    """'463 fail or warn, 12 inconclusive, 3 raised before the doctor' of the problems' rows."""
    n = Counter("fail or warn" if f["verdict"] in ("fail", "warn") else f["verdict"] for p in ps for f in p["rows"])
    words = {"fail or warn": "fail or warn", "inconclusive": "inconclusive", "error": "raised before the doctor"}
    return ", ".join(f"{n[k]} {w}" for k, w in words.items() if n[k])


def summary(lib: Library, z: dict, fig_dir: Path) -> str:
    ps = zoo.problems(z, lib.spec)
    rows = sum(len(p["rows"]) for p in ps)
    line = (f"{lib.library} {triage.release_of(z)}: **{z['examined']} of {z['targets']}** {lib.target}s examined "
            f"({_per_path(z)}); {zoo.rows_of(rows)} not a pass or n/a ({_verdicts(ps) or 'none'}) from "
            f"**{zoo.count_of(len(ps), 'problem')}**: " + (zoo.kinds_text(ps, "; ") or "none")
            + f"; the run {zoo.cost_text(z.get('cost', {}))}.")
    tables = releases.load_tables(lib.root(fig_dir))
    if len(tables) > 1:
        over = releases.over_releases(tables, spec=lib.spec)
        fixed = [q for q in over["problems"] if q["fixed_in"]]
        line += (f" Over {len(tables)} releases ({', '.join(tables)}): {zoo.count_of(len(over['problems']), 'problem')}, "
                 f"{len(fixed)} fixed by a later release.")
    return line + "\n"


def render(lib: Library, z: dict, fig_dir: Path) -> str:
    results, impls = z["results"], z["impls"]
    examined = [r for r in results if r["status"] == "examined"]
    out = [f"## {lib.title}\n",
           f"`{lib.command}` {lib.about} {lib.library} {triage.release_of(z)}, torch {z['torch']}, CPU; each "
           f"{lib.target} in a process of its own. **{z['examined']} of {z['targets']}** {lib.target}s were examined "
           f"on at least one path ({', '.join(impls)}). The run as a whole (imports, builds, checks): "
           f"{zoo.cost_text(z.get('cost', {}))}.\n"]
    cnt = Counter((r["impl"], r["status"]) for r in results)
    cols = [s for s in zoo.STATUSES if any(cnt[(i, s)] for i in impls)]
    out.append("| path | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
    out += [f"| {i} | " + " | ".join(str(cnt[(i, s)]) for s in cols) + " |" for i in impls]
    out += zoo.verdict_table(examined, impls, f"{lib.target}s examined on that path")
    ps = zoo.problems(z, lib.spec)
    rows = sum(len(p["rows"]) for p in ps)
    out.append(f"\n### {lib.library}: every row that is not a pass or n/a, one entry per problem\n\n{zoo.rows_of(rows)} "
               f"({_verdicts(ps) or 'none'}), **{zoo.count_of(len(ps), 'problem')}**: {zoo.kinds_text(ps, ', ') or 'none'}. "
               f"A fail, a warn, an inconclusive check and a {lib.target} that raised before the doctor could examine "
               f"it are each a row; a problem is one cause (`{_rel(lib.spec.rules)}`): a known behaviour with its "
               "public thread or the library source that says it is by design, a doctor false alarm with its fix, or "
               "a new finding with its page in `docs/findings/` (a repro with the library and torch only, the cause "
               "in its source, a patch, the report to file). A row no entry explains is **untriaged**.\n")
    out.append(f"| problem | triage | rows | where ({lib.target}, paths) | thread or finding |\n|---|---|---|---|---|")
    for p in ps:
        e = p["entry"]
        what = (f"{zoo.KIND_NAMES[p['shown']]}: {e['note']}" if e else
                f"**untriaged** ({', '.join(sorted({f['check'] for f in p['rows']}))})")
        out.append(f"| {p['key']} | {what} | {len(p['rows'])} | {triage.where(p['rows'])} | {zoo.ref(e)} |")
    out += _inconclusive(z, ps)
    ne = {a: why for a, why in z.get("not_examined", {}).items()}
    if ne:
        out.append(f"\n### {lib.library}: {lib.target}s not examined ({len(ne)})\n\nEach with why (by design, a path the library refuses, "
                   "or the error above):\n")
        out += [f"- **{a}**: " + "; ".join(reasons) for a, reasons in sorted(ne.items())]
    if z.get("not_run"):
        out.append(f"\nNot run in this table: {', '.join(z['not_run'])}.")
    out += _over_releases(lib, fig_dir)
    return "\n".join(out) + "\n"


def _inconclusive(z: dict, ps: list[dict]) -> list[str]:
    """The inconclusive rows' share of the check rows, and the problem each is under (a library zoo
    triages them with its fails: what stops the check there is the target's, known or found)."""
    by = [(p, sum(f["verdict"] == "inconclusive" for f in p["rows"])) for p in ps]
    by = [(p, n) for p, n in by if n]
    if not by:
        return []
    i = {"rows": sum(n for _, n in by),
         "checks": sum(len(r.get("checks", [])) for r in z["results"] if r["status"] == "examined")}
    return [f"\nInconclusive: {zoo.share_text(i)}, each under the problem above that stops the check there: "
            + ", ".join(f"{p['key']} ({n}, {zoo.KIND_NAMES[p['shown']]})" for p, n in by) + "."]


def _over_releases(lib: Library, fig_dir: Path) -> list[str]:
    tables = releases.load_tables(lib.root(fig_dir))
    if len(tables) < 2:
        return []
    over = releases.over_releases(tables, spec=lib.spec)
    vs = over["releases"]
    zoo.draw(over, Path(fig_dir) / lib.figure, f"The {lib.library} zoo over releases: each {lib.target}'s worst row")
    return [f"\n### {lib.library} across releases\n\nThe same zoo, doctor and triage on {len(vs)} {lib.library} releases "
            f"({', '.join(vs)}), each installed on its own (`{lib.command} --release VERSION --pinned DIR`, its table "
            f"in `results/{lib.results}/VERSION/`); `results/{lib.results}/releases.csv` is this table. Per problem: "
            f"the first release examined that has it, and the first release after its last that no longer has it "
            f"while its {lib.target}s are examined there. An option a release does not have yet is `absent`.\n",
            f"![{lib.target}s x releases]({Path(fig_dir).name}/{lib.figure})\n", *zoo.over_releases_table(over),
            "\nWhat each release's zoo cost as a whole (imports, builds, checks; 2 CPU cores shared):\n",
            *zoo.cost_table(over, f"{lib.target}s")]


def _rel(path: Path) -> str:
    """path from the clone's root (a committed page names no machine's directories)."""
    try:
        return Path(path).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)
