"""The option zoo's cost in the lab's report (results/DOCTOR.md): per release, from the option tables
`python -m doctor_lab.zoo --options` committed under results/zoo_options/<version>/ (options.json: each
architecture's discovery, wall and CPU seconds; zoo.json: its jobs, one per architecture x option set,
the command's session cost and each result's), and, where a committed zoo table of the same release
gives its number of causal LMs, the whole release extrapolated from the architectures measured, said
as such."""
import json
from pathlib import Path
from statistics import mean

NAME = "zoo_options_cost"


def root(fig_dir: Path) -> Path:
    return Path(fig_dir).parent / "zoo_options"


def _read(p: Path) -> dict | None:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def release_archs(results: Path, version: str) -> int | None:
    """The number of causal LMs of `version`, from the plain zoo's committed table of that release."""
    for p in (results / "zoo" / "zoo.json", results / "zoo" / "releases" / version / "zoo.json"):
        z = _read(p)
        if z and z.get("transformers") == version and isinstance(z.get("archs"), int):
            return z["archs"]
    return None


def measured(d: Path) -> dict | None:
    """One release's option zoo as measured: its architectures and their discovery (wall and CPU
    seconds of each discovery process, its imports aside), its jobs (architecture x option set: wall
    and CPU of the build and the checks, the results' sums over the implementations) and the command
    as a whole (zoo.json's cost: wall and CPU from its start, imports and every worker waited for)."""
    found = _read(d / "options.json")
    if not found:
        return None
    zoo = _read(d / "zoo.json") or {}
    archs = sorted(found)
    disc = [found[a].get("cost") or {} for a in archs]
    jobs: dict[tuple, list[dict]] = {}
    for r in zoo.get("results", []):
        jobs.setdefault((r["arch"], r.get("option_label", "")), []).append(r)
    c = zoo.get("cost") or {}
    return {"version": d.name, "archs": archs, "tried": sum(found[a].get("tried", 0) for a in archs),
            "sets": sum(1 + len(found[a].get("found", [])) for a in archs if found[a].get("status") == "discovered"),
            "disc_wall": sum(x.get("wall_s", 0) for x in disc), "disc_cpu": sum(x.get("cpu_s", 0) for x in disc),
            "job_wall": [sum(r.get("wall_s") or 0 for r in rs) for rs in jobs.values()],
            "job_cpu": [sum(r.get("cpu_s") or 0 for r in rs) for rs in jobs.values()],
            "impls": sorted({r["impl"] for rs in jobs.values() for r in rs}),
            "cmd_wall": c.get("wall_s"), "cmd_cpu": c.get("cpu_s"), "workers": c.get("workers") or []}


def _s(x) -> str:
    return "" if x is None else f"{x / 60:.1f} min" if x >= 120 else f"{x:.1f} s" if x < 10 else f"{x:.0f} s"


def row(m: dict) -> str:
    n = len(m["job_cpu"])
    jobs = (f"{n} ({'+'.join(m['impls'])}) | {_s(mean(m['job_wall']))} / {_s(mean(m['job_cpu']))}; "
            f"{_s(max(m['job_wall']))} / {_s(max(m['job_cpu']))} | {_s(m['cmd_wall'])} / {_s(m['cmd_cpu'])}"
            f" ({'+'.join(map(str, m['workers']))} worker{'s' if m['workers'] != [1] else ''})"
            if n else "not run | | ")
    return (f"| {m['version']} | {', '.join(m['archs'])} | {m['tried']} | {m['sets']} | "
            f"{_s(m['disc_wall'])} / {_s(m['disc_cpu'])} | {jobs} |")


def extrapolated(m: dict, n: int, jobs_from: dict | None) -> str:
    """The whole release at the means measured: n architectures x (discovery CPU + option sets x job CPU)."""
    k = len(m["archs"])
    disc, sets = m["disc_cpu"] / k, m["sets"] / k
    job = mean(jobs_from["job_cpu"]) if jobs_from else None
    total = n * (disc + (sets * job if job is not None else 0))
    where = "" if jobs_from is m or not jobs_from else \
        f", as measured in {jobs_from['version']} ({', '.join(jobs_from['archs'])}: this release's jobs were not run)"
    jobs = (f" + {n * sets:,.0f} jobs at {job:.1f} CPU s each{where}" if job is not None
            else "; no release's jobs measured, so not counted")
    return (f"- **{m['version']}, extrapolated, not measured**: its {n} causal LMs at the means of the {k} "
            f"architectures measured ({', '.join(m['archs'])}): discovery {disc:.1f} CPU s and {sets:.1f} option sets "
            f"per architecture; {n} discoveries{jobs} = {total / 60:,.0f} CPU min, about {total / 120:,.0f} min on 2 "
            f"cores, each process's imports and the command's aside.")


def blocks(runs, fig_dir: Path) -> dict[str, str]:
    """The cost table (`zoo_options_cost`); none without an option table."""
    d = root(fig_dir)
    from doctor_lab.report.releases import version_key
    ms = [m for m in (measured(p) for p in sorted(d.glob("*/"), key=lambda p: version_key(p.name))) if m]
    if not ms:
        return {}
    lines = ["### The option zoo's cost", "",
             "What `python -m doctor_lab.zoo --options` cost per release, measured on this machine (2 CPU cores "
             "shared with other work: wall clock above CPU time is waiting), on the architectures it was run on: "
             "finding the options (one process per architecture: `options.json`, wall and CPU seconds of each, its "
             "imports aside), then one job per architecture x option set (build and checks under each "
             "implementation: the results' wall and CPU seconds, the mean and the largest job) and the command as "
             "a whole (`zoo.json`: from its start, imports and every worker it waited for; with the discovery where "
             "the same command ran it).",
             "",
             "| release | architectures | values tried | option sets | discovery wall / CPU | jobs | per job wall / CPU "
             "(mean; largest) | command wall / CPU |",
             "|---|---|---|---|---|---|---|---|", *map(row, ms), ""]
    results = Path(fig_dir).parent
    with_jobs = [m for m in ms if m["job_cpu"]]
    for m in ms:
        n = release_archs(results, m["version"])
        if n:
            lines.append(extrapolated(m, n, m if m["job_cpu"] else (with_jobs[-1] if with_jobs else None)))
    return {NAME: "\n".join(lines).rstrip() + "\n"}
