"""The generated bed's runner: build each sampled (style, bug), examine it (a healthy one under every
check; a bug under its expected checks, the checks n/a by construction and SANITY), judge it
against its expected outcome, and write the evidence: one JSON line per combination as it goes
(`combos.jsonl`, so a run cut short keeps what it did, and `--resume` goes on from it), then
`generated.json` (the bed's size, the axes and bugs, every combination's rows and verdict)."""
import json
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

from doctor_lab.generated import combos, judge, records

SCHEMA = 1


class Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise Timeout


def examine_combo(combo_id: str, timeout: int) -> dict:
    """One combination's record: its rows (check -> [outcome, cause]), its verdict, seconds."""
    import torch

    from attention_doctor import examine
    from doctor_lab.generated.lm import build

    torch.set_num_threads(1)
    c = combos.Combo.parse(combo_id)
    exp = c.expected
    checks = None if c.bug == combos.HEALTHY else list(dict.fromkeys(judge.SANITY + exp.checks))
    start, rows, error = time.time(), {}, ""
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        result = examine(build(c.style, c.bug), checks=checks)
        rows = {r.name: (r.outcome.value, r.cause) for r in result.checks}
    except Timeout:
        error = f"timeout after {timeout} s"
    except Exception as e:  # noqa: BLE001 -- examine() raised (a TargetError or a doctor bug): a miss of kind error, named
        error = f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        signal.alarm(0)
    miss = judge.judge(exp, rows, error)
    return {"id": combo_id, "bug": c.bug, "rows": {k: list(v) for k, v in rows.items()},
            "checks": "all" if checks is None else len(checks), "right": miss is None,
            "miss": None if miss is None else miss.to_dict(), "seconds": round(time.time() - start, 2)}


def _worker(args):
    return examine_combo(*args)


def run(ids: list[str], out: Path, workers: int = 1, timeout: int = 300, log=print,
        stop_after: float | None = None) -> list[dict]:
    """Every id's record, appended to out/combos.jsonl as it comes (ids already there are kept); with
    stop_after (seconds), no new combination starts after that long: the records done, in ids' order."""
    out.mkdir(parents=True, exist_ok=True)
    lines = out / "combos.jsonl"
    done = {}
    if lines.is_file():
        for line in lines.read_text().splitlines():
            rec = json.loads(line)
            done[rec["id"]] = rec
    todo = [i for i in ids if i not in done]
    log(f"{len(ids)} combinations, {len(done)} already in {lines}, {len(todo)} to run on {workers} worker(s)")
    start = time.time()
    with lines.open("a") as f:
        if workers <= 1:
            results = (examine_combo(i, timeout) for i in todo)
        else:
            pool = multiprocessing.get_context("spawn").Pool(workers)
            results = pool.imap_unordered(_worker, [(i, timeout) for i in todo])
        for n, rec in enumerate(results, 1):
            done[rec["id"]] = rec
            f.write(json.dumps(rec) + "\n")
            f.flush()
            if n % 25 == 0 or not rec["right"]:
                log(f"[{n}/{len(todo)} {time.time() - start:.0f} s] {rec['id']} {rec['seconds']} s "
                    + ("right" if rec["right"] else f"MISS {rec['miss']}"))
            if stop_after is not None and time.time() - start > stop_after:
                log(f"stopped after {time.time() - start:.0f} s (--stop-after {stop_after:.0f}): {len(done)} done")
                break
        if workers > 1:
            pool.terminate()
    return [done[i] for i in ids if i in done]


def evidence(ids: list[str], recs: list[dict], sample: int, seed: int, workers: int, wall_s: float) -> dict:
    """generated.json: the bed's records (axes, bugs) beside every combination's outcome."""
    right = sum(r["right"] for r in recs)
    return {
        "schema": SCHEMA, "command": f"python -m doctor_lab.generated --sample {sample} --seed {seed} "
                                     f"--workers {workers} --out DIR",
        "sample": sample, "seed": seed, "workers": workers, "wall_s": round(wall_s),
        "cpu_s": round(sum(r["seconds"] for r in recs)), "size": len(recs), "right": right,
        "axes": {axis: [v.name for v in vals] for axis, vals in records.AXES.items()},
        "bugs": {b.name: [str(e) for e in b.expects] for b in records.BUGS_LIST},
        "population": {bug: len(styles) for bug, styles in combos.population().items()},
        "combos": recs,
    }


def add_twins(out: Path, timeout: int, log=print, stop_after: float | None = None) -> dict:
    """Each miss's twin (triage.twin_of: the values its reason blames swapped out) examined, and the
    evidence in out/generated.json given `twin: {id, right}` per miss that has one: a reason is
    witnessed where its twins are right."""
    from doctor_lab.generated import triage
    path = out / "generated.json"
    ev = json.loads(path.read_text())
    start = time.time()
    for rec in ev["combos"]:
        if rec["right"] or "twin" in rec:
            continue
        if stop_after is not None and time.time() - start > stop_after:
            log(f"twins stopped after {time.time() - start:.0f} s (--stop-after)")
            break
        c = combos.Combo.parse(rec["id"])
        reason = triage.reason_of(c, rec["miss"])
        twin = None if reason is None else triage.twin_of(c, reason)
        if twin is not None:
            t = examine_combo(twin.id, timeout)
            rec["twin"] = {"id": twin.id, "right": t["right"], "miss": t["miss"]}
            log(f"twin of {rec['id']}: {twin.id} {'right' if t['right'] else 'MISS ' + str(t['miss'])}")
    path.write_text(json.dumps(ev, separators=(",", ":")) + "\n")
    return ev


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m doctor_lab.generated", description=__doc__.splitlines()[0])
    p.add_argument("--sample", type=int, default=2400, help="how many (style, bug) combinations (default 2400)")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    p.add_argument("--workers", type=int, default=1, help="processes (default 1: each is single-threaded)")
    p.add_argument("--timeout", type=int, default=300, help="seconds per combination before it is a miss (error)")
    p.add_argument("--out", type=Path, required=True, help="where combos.jsonl and generated.json go")
    p.add_argument("--only", nargs="+", default=None, metavar="ID",
                   help="combination ids (STYLE/BUG, as the evidence names them) instead of a sample")
    p.add_argument("--stop-after", type=float, default=None, metavar="SECONDS",
                   help="start no combination after this long; the evidence holds those done (its size says so)")
    p.add_argument("--twins", action="store_true",
                   help="run nothing new: examine the twin of each miss in --out's generated.json (its reason's "
                        "blamed values swapped out) and record it there")
    a = p.parse_args(argv)
    if a.twins:
        if not (a.out / "generated.json").is_file():
            print(f"error: --twins needs {a.out / 'generated.json'} (a finished run)", file=sys.stderr)
            return 2
        ev = add_twins(a.out, a.timeout, log=lambda s: print(s, flush=True), stop_after=a.stop_after)
        tw = [r["twin"] for r in ev["combos"] if "twin" in r]
        print(f"{len(tw)} twins examined, {sum(t['right'] for t in tw)} right")
        return 0
    if a.sample < 1 or a.workers < 1 or a.timeout < 1:
        print("error: --sample, --workers and --timeout must be positive", file=sys.stderr)
        return 2
    try:
        ids = a.only if a.only else [c.id for c in combos.sample(a.sample, a.seed)]
        for i in ids:
            combos.Combo.parse(i)
    except (ValueError, KeyError) as e:
        print(f"error: not a combination id: {e}", file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    start = time.time()
    recs = run(ids, a.out, a.workers, a.timeout, log=lambda s: print(s, flush=True), stop_after=a.stop_after)
    ev = evidence(ids, recs, a.sample, a.seed, a.workers, time.time() - start)
    (a.out / "generated.json").write_text(json.dumps(ev, separators=(",", ":")) + "\n")
    print(f"{ev['size']} combinations, {ev['right']} right ({ev['right'] / ev['size']:.2%}); "
          f"{ev['cpu_s']} s examining; evidence in {a.out / 'generated.json'}")
    from doctor_lab.generated.triage import reason_of
    for r in recs:
        if not r["right"]:
            reason = reason_of(combos.Combo.parse(r["id"]), r["miss"])
            why = f"{reason.name} ({reason.whose}'s)" if reason else "untriaged"
            print(f"  MISS {r['id']}: {r['miss']['kind']} {r['miss']['check']} {r['miss']['got']}; reason: {why}")
    return 0
