"""The option zoo (`python -m doctor_lab.zoo --options`): per architecture, its options found by
measurement (options.py; one capped process each, as the zoo's), written as the release's option
table (options.csv, options.json: which fields, found how, and what finding them cost); then the
doctor on the default and on every option set found, one job per architecture x option set (the
zoo's runner and worker: resumable, capped), into the zoo's table with an `options` column."""
import csv
import functools
import hashlib
import json
import time
from pathlib import Path

from doctor_lab.zoo import options as opt
from doctor_lab.zoo.worker import examine_one, run_arch, settle
from experiments.io import atomic_write, write_json

DISCOVER = "discover"   # the one "implementation" of a discovery job (runner.run's unit)
COLUMNS = ["arch", "options", "kind", "found", "by", "impls", "lines", "over", "error"]


def discovery_path(out: Path, arch: str, impl: str = DISCOVER) -> Path:
    return Path(out) / "discovery" / f"{arch}.json"


def code_hash() -> str:
    """Changes when the discovery's code does: a table found by other code is stale."""
    return hashlib.sha1(Path(opt.__file__).read_bytes()).hexdigest()[:8]


def discover_job(arch, impls, out, checks, table, table_hash, mem_bytes=None, cpu_s=None):
    """The body of one architecture's discovery process (runner.run forks it): `checks` carries the
    implementations to measure under (the runner's unit here is the discovery, not an impl)."""
    settle(Path(out) / "logs" / f"discover-{arch}.log", mem_bytes, cpu_s)
    t0 = time.perf_counter()
    try:
        d = opt.discover(arch, checks, table)
    except Exception as e:  # noqa: BLE001  the shrunk default does not build here: a row saying so, never options
        d = {"arch": arch, "status": "not_built", "reason": opt._line(e), "tried": [],
             "cost": {"wall_s": round(time.perf_counter() - t0, 1)}}
    write_json(discovery_path(out, arch), {**d, "shrink_hash": table_hash})


def load(out: Path, archs) -> dict[str, dict]:
    """arch -> its discovery (those there are)."""
    got = {}
    for a in archs:
        try:
            got[a] = json.loads(discovery_path(out, a).read_text())
        except (OSError, ValueError):
            continue
    return got


def write_table(out: Path, found: dict[str, dict]) -> list[dict]:
    """options.csv (one row per value tried: found or not, by what, under which impls) and options.json
    (per architecture: its attention modules, status, cost). Sorted, no timestamps."""
    rows = [{"arch": a, "options": t["label"], "kind": t["kind"], "found": "yes" if t["found"] else "no",
             "by": "+".join(t["by"]), "impls": "+".join(t["impls"]), "lines": t["lines"], "over": t["over"],
             "error": t["error"][:160]}
            for a, d in sorted(found.items()) for t in d.get("tried", [])]

    def w(f):
        wr = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        wr.writeheader()
        wr.writerows(rows)
    atomic_write(Path(out) / "options.csv", w)
    summary = {a: {"status": d.get("status"), "reason": d.get("reason", ""), "attention": d.get("attention", []),
                   "transformers": d.get("transformers"), "tried": len(d.get("tried", [])),
                   "found": sorted(t["label"] for t in d.get("tried", []) if t["found"]), "cost": d.get("cost", {}),
                   "sets": [{"label": t["label"], "options": t["options"]} for t in d.get("tried", []) if t["found"]]}
               for a, d in sorted(found.items())}
    text = json.dumps(summary, sort_keys=True, indent=1)
    atomic_write(Path(out) / "options.json", lambda f: f.write(text + "\n"))
    return rows


def sets_of(table_dirs, archs) -> dict[str, list[dict]]:
    """arch -> the option sets other releases' option tables (their options.json) found for it."""
    out: dict[str, list[dict]] = {}
    for d in table_dirs:
        try:
            summary = json.loads((Path(d) / "options.json").read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"no option table in {d} ({type(e).__name__}): run the option zoo there first") from None
        for a in archs:
            out.setdefault(a, []).extend(s["options"] for s in (summary.get(a) or {}).get("sets", []))
    return out


def jobs(found: dict[str, dict], also: dict[str, list[dict]] | None = None) -> dict[str, tuple[str, dict]]:
    """One job per architecture x option set: key (a file name) -> (arch, options); `also`: option sets
    found in other releases (sets_of), examined here too so that rows compare like for like."""
    out = {}
    for a, d in sorted(found.items()):
        if d.get("status") != "discovered":
            continue
        for o in opt.option_sets(d) + [o for o in (also or {}).get(a, []) if o not in opt.option_sets(d)]:
            lab = opt.label(o)
            out[f"{a}@{hashlib.sha1(lab.encode()).hexdigest()[:10]}" if lab else a] = (a, o)
    return out


def examine_job(sets: dict, key: str, impl: str, table: dict, checks) -> dict:
    """worker.examine_one on the job's architecture with its option values; the row names them."""
    arch, options = sets[key]
    res = examine_one(arch, impl, table, checks, options=options)
    return {**res, "arch": arch, "options": options, "option_label": opt.label(options)}


def run_jobs(sets: dict, tasks: dict, out: Path, **kw) -> None:
    """The doctor over `tasks` (job key -> impls), a job each (launch.run: local workers, submitit_local
    or slurm); a row written for a job that died (timeout, crash, memory) names its architecture and
    options as the others do."""
    from doctor_lab.zoo import launch
    from doctor_lab.zoo.worker import result_path
    launch.run(tasks, out, body=functools.partial(run_arch, examine=functools.partial(examine_job, sets)), **kw)
    for key, impls in tasks.items():
        arch, options = sets[key]
        for impl in impls:
            p = result_path(out, key, impl)
            try:
                r = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            if "option_label" not in r:
                write_json(p, {**r, "arch": arch, "options": options, "option_label": opt.label(options)})


def options_delta(old_dir: Path, new_dir: Path) -> tuple[dict, dict]:
    """(new, gone): arch -> the option labels found in one release's option table only."""
    def found(d):
        try:
            return {a: set(v.get("found", [])) for a, v in json.loads((Path(d) / "options.json").read_text()).items()}
        except (OSError, ValueError):
            return {}
    o, n = found(old_dir), found(new_dir)
    new = {a: sorted(n[a] - o.get(a, set())) for a in n if a in o and n[a] - o[a]}
    gone = {a: sorted(o[a] - n.get(a, set())) for a in o if a in n and o[a] - n[a]}
    return new, gone


def render_delta(new: dict, gone: dict, old: str, release: str) -> str:
    """The options found in one release only, as the sentinel's page ends with them."""
    out = []
    for title, by in ((f"Options found in {release} only", new), (f"Options found in {old} only", gone)):
        if by:
            out += [f"## {title} ({sum(map(len, by.values()))})", ""] + [f"- {a}: {', '.join(v)}" for a, v in sorted(by.items())] + [""]
    return "\n" + "\n".join(out) if out else ""
