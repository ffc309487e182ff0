"""A zoo over another library's named targets (doctor_lab.zoo_xt: x-transformers' options;
doctor_lab.zoo_diffusers: diffusers' attention processors), run by this zoo's runner and worker
(one capped process per target, resumable): each target x path built by the library's adapter,
a forward and a cache step, then the doctor; the table (the zoo's columns, `arch` = the target,
`impl` = the path) and the cost of the run (wall and CPU time, every invocation)."""
import argparse
import csv
import functools
import json
import resource
import time
import traceback
from pathlib import Path

from doctor_lab.zoo import runner, table
from doctor_lab.zoo.shrink import NotExamined
from doctor_lab.zoo.worker import NO_FORWARD, NOT_BUILT, SKIPPED, UNSUPPORTED, _is_memory, _line, run_arch, run_doctor
from experiments.io import atomic_write, write_json


def smoke(adapter) -> dict:
    """A forward on (2, 8) inputs, then, where the adapter has a cache, a prefill of 6 and a step
    of 2 against the full forward (a number; the doctor's kv_cache check judges it)."""
    import torch

    from attention_doctor import Unsupported
    x = adapter.sample(2, 8, torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = adapter.forward(x)
        out = {"shape": list(full.shape), "finite": bool(torch.isfinite(full).all())}
        try:
            state, _ = adapter.prefill(x[:, :6])
            _, step = adapter.step(state, x[:, 6:])
            err = (step - full[:, 6:]).abs().max() / full[:, 6:].abs().max().clamp_min(1e-30)
            out["cache_step_rel_err"] = float(err)
        except Unsupported as e:
            out["cache"] = str(e)
        except Exception as e:  # noqa: BLE001 -- the smoke's cache step raised: recorded in smoke, the doctor's kv_cache check judges it
            if _is_memory(e):
                raise
            out["cache"] = f"raised {_line(e)}"
    return out


def examine_target(build, name: str, impl: str, checks) -> dict:
    """The result of one target x path. build(name, impl) -> an Adapter, or raises NotExamined
    (the zoo's table says why not), Unsupported (the library does not offer this path here) or
    TargetError (the library refuses to build it). Never raises, except for memory."""
    from attention_doctor import TargetError, Unsupported
    res = {"arch": name, "impl": impl}
    try:
        adapter = build(name, impl)
    except NotExamined as e:
        return {**res, "status": SKIPPED, "reason": str(e)}
    except Unsupported as e:
        return {**res, "status": UNSUPPORTED, "stage": "build", "reason": str(e)[:300]}
    except Exception as e:  # noqa: BLE001 -- the target's build raised: status not_built, never a verdict
        if _is_memory(e):
            raise
        why = str(e) if isinstance(e, TargetError) else _line(e)
        return {**res, "status": NOT_BUILT, "stage": "build", "reason": why[:300]}
    res["class"] = type(adapter.module).__name__
    res["params"] = sum(p.numel() for p in adapter.module.parameters())
    try:
        res["smoke"] = smoke(adapter)
    except Exception as e:  # noqa: BLE001 -- the plain forward raised before the doctor: status no_forward, with its trace
        if _is_memory(e):
            raise
        return {**res, "status": NO_FORWARD, "stage": "forward", "reason": _line(e),
                "trace": traceback.format_exc(limit=-4)}
    if checks == []:
        return {**res, "status": "ran"}
    return run_doctor(res, adapter, f"{name} {impl}", checks)


# -- cost ------------------------------------------------------------------------------------------
def _cpu_now() -> float:
    """CPU seconds of this process and of its children that have ended (the workers)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


class Cost:
    """Wall and CPU time of one invocation, appended to <out>/cost.json (a fresh run starts it
    anew, a resumed one adds to it: the table's cost is every invocation that produced it)."""

    def __init__(self, out: Path, fresh: bool):
        self.path, self.fresh = Path(out) / "cost.json", fresh
        self.t0, self.c0 = time.monotonic(), _cpu_now()

    def record(self, ran: int, workers: int):
        runs = [] if self.fresh or not self.path.exists() else json.loads(self.path.read_text())["runs"]
        runs.append({"targets": ran, "workers": workers, "wall_s": round(time.monotonic() - self.t0, 1),
                     "cpu_s": round(_cpu_now() - self.c0, 1)})
        write_json(self.path, {"runs": runs})


def cost(out: Path) -> dict:
    p = Path(out) / "cost.json"
    runs = json.loads(p.read_text())["runs"] if p.exists() else []
    return {"wall_s": round(sum(r["wall_s"] for r in runs), 1), "cpu_s": round(sum(r["cpu_s"] for r in runs), 1),
            "invocations": len(runs), "workers": max((r["workers"] for r in runs), default=0)}


# -- the table -------------------------------------------------------------------------------------
COLUMNS = {"arch": "target", "impl": "path", "class": "module"}


def write(out: Path, names: list[str], meta: dict) -> dict:
    """zoo.csv (one row per target x path x check, or one saying why there is none) and zoo.json
    (meta, counts, cost, the results whole) for the targets `names`; sorted, no timestamps. A
    clean clone has the committed table and no result files: the table is kept."""
    wanted = set(names)
    results = [r for r in table.load(out) if r["arch"] in wanted]
    here = {r["arch"] for r in results}
    if not results:
        p = Path(out) / "zoo.json"
        return json.loads(p.read_text()) if p.exists() else {**meta, "targets": len(names), "examined": 0}
    results, old = table.committed(out, results, meta, wanted)
    if results is None:
        return old
    rows = [{COLUMNS.get(k, k): v for k, v in r.items()} for r in table.flat(results)]

    def w(f):
        wr = csv.DictWriter(f, fieldnames=[COLUMNS.get(c, c) for c in table.COLUMNS], lineterminator="\n")
        wr.writeheader()
        wr.writerows(rows)
    atomic_write(Path(out) / "zoo.csv", w)
    seen, ran = table.examined_archs(results), {r["arch"] for r in results}
    summary = {**meta, "targets": len(names), "examined": len(seen), "impls": sorted({r["impl"] for r in results}),
               "cost": (old.get("cost") or {}) if old and wanted - here else cost(out),   # as table.write says why
               "not_examined": {a: table._why_not(results, a) for a in sorted(wanted - seen) if a in ran},
               "not_run": sorted(wanted - ran),
               "results": [table._slim(r) for r in results]}
    text = json.dumps(summary, sort_keys=True, separators=(",", ":"), default=str)
    atomic_write(Path(out) / "zoo.json", lambda f: f.write(text.replace(',{"arch"', ',\n{"arch"')))
    return summary


# -- the command line ------------------------------------------------------------------------------
def arguments(p: argparse.ArgumentParser, paths: tuple[str, ...]) -> argparse.ArgumentParser:
    """The options every library zoo takes (as the transformers zoo's)."""
    p.add_argument("--target", nargs="+", help="targets (default: all of the zoo's table); commas work too")
    p.add_argument("--path", default=",".join(paths), help=f"paths, comma-separated (default {','.join(paths)})")
    p.add_argument("--out", type=Path, help="where runs/, logs/, zoo.csv and zoo.json go")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=int, default=300, help="wall-clock seconds per target")
    p.add_argument("--cpu", type=int, default=240, help="CPU seconds per target (SIGXCPU past it)")
    p.add_argument("--mem-gb", type=float, default=3.0, help="address-space cap per target")
    p.add_argument("--checks", default="all", help="doctor checks, comma-separated; 'none': build and forward only")
    p.add_argument("--redo", action="store_true", help="rerun results that exist")
    p.add_argument("--table", action="store_true", help="only rewrite zoo.csv and zoo.json")
    return p


def fail(prog: str, msg: str):
    print(f"{prog}: {msg}", file=__import__("sys").stderr)
    raise SystemExit(2)


def selected(prog: str, a, names: list[str], paths: tuple[str, ...]) -> tuple[list[str], list[str], list | None]:
    """(targets, paths, checks) the arguments ask for; bad input is one line and exit 2."""
    chosen = [x for s in a.target for x in s.split(",") if x] if a.target else names
    unknown = [x for x in chosen if x not in names]
    if unknown:
        fail(prog, f"not in the zoo's table: {', '.join(unknown[:8])}")
    impls = [i for i in a.path.split(",") if i]
    if not impls or any(i not in paths for i in impls):
        fail(prog, f"--path {a.path!r}: give some of {','.join(paths)}")
    checks = None if a.checks == "all" else [] if a.checks == "none" else a.checks.split(",")
    if checks:
        from attention_doctor.checks import ORDER
        bad = [c for c in checks if c not in ORDER]
        if bad:
            fail(prog, f"unknown check(s) {', '.join(bad)}; known: {', '.join(ORDER)}")
    return chosen, impls, checks


def run(prog: str, a, every: list[str], chosen: list[str], impls: list[str], checks, build, entry_hash,
        meta: dict, preload) -> dict:
    """Run what is pending of `chosen` (each target in a capped process of its own, resuming what
    a killed run left), record the cost, write the table of `every` target. build(name, impl) ->
    Adapter (examine_target); entry_hash(name): changes when the table's entry for it changes."""
    doctor = runner.doctor_hash()
    suffix = "" if checks is None else "-" + ",".join(checks or ["none"])
    hashes = {n: f"{entry_hash(n)}-{meta.get('version', '')}-{doctor}{suffix}" for n in chosen}
    tasks = runner.pending(chosen, impls, a.out, hashes, a.redo)
    if not a.table and tasks:
        print(f"{prog}: {len(tasks)} target(s) to run, {len(chosen) - len(tasks)} already done; {a.workers} "
              f"worker(s), logs in {a.out}/logs", flush=True)
        clock = Cost(a.out, fresh=sum(len(i) for i in tasks.values()) == len(every) * len(impls))
        examine = functools.partial(_examine, build)
        runner.run(tasks, a.out, checks=checks, table={"archs": {}}, hashes=hashes, workers=a.workers,
                   timeout_s=a.timeout, cpu_s=a.cpu, mem_bytes=int(a.mem_gb * 2 ** 30),
                   body=functools.partial(run_arch, examine=examine), preload=preload)
        clock.record(sum(len(i) for i in tasks.values()), a.workers)
    return write(a.out, every, meta)


def _examine(build, name, impl, table_, checks):
    return examine_target(build, name, impl, checks)
