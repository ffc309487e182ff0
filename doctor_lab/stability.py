"""The gate does not move: every healthy target of the test beds (doctor_lab/styles: each style's
healthy model; doctor_lab/styles/classic.py: the classic four) examined N times, each run in a
process of its own as a CI job is, beside K busy processes (each a CPU spin that stops by itself
after --busy-seconds), and the outcomes compared: a flip is a run whose (outcome, cause) of a
target's check differs from the first run's.

    python -m doctor_lab.stability                       # 10 runs beside 2 busy processes, every target
    python -m doctor_lab.stability --runs 3 --busy 1 --targets gpt_fast,nanogpt

Prints one line per target (its flips, the exit codes its runs gave), then the totals; exits 1
if anything flipped. --out FILE keeps the runs as JSON. Torch runs in the children with the
threads torch chooses (the reordering across threads a loaded machine gives is what is measured)."""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPIN = "import time\nend = time.time() + {s}\nx = 0\nwhile time.time() < end:\n    x += 1\n"


def targets() -> dict[str, str]:
    """{name: bed} of the beds' healthy targets: each style's (styles) and the classic four (classic)."""
    from doctor_lab.styles import STYLES
    from doctor_lab.styles.classic import STYLES as CLASSIC
    return {**{s: "styles" for s in STYLES}, **{s: "classic" for s in CLASSIC}}


def build(name: str):
    if targets()[name] == "classic":
        from doctor_lab.styles import classic
        return classic.build(name)
    from doctor_lab.styles import build as build_style
    return build_style(name)


def worker(names: list[str]) -> dict:
    """One run: {target: {"exit_code": int, "rows": {check: [outcome, cause]}}} (a target that cannot
    be examined: {"error": its one line})."""
    from attention_doctor import TargetError, examine
    out = {}
    for name in names:
        try:
            r = examine(build(name), name=name)
        except TargetError as e:
            out[name] = {"error": str(e)}
            continue
        out[name] = {"exit_code": r.exit_code, "rows": {c.name: [c.outcome.value, c.cause] for c in r.checks}}
    return out


def flips(runs: list[dict]) -> dict[str, dict[str, int]]:
    """{target: {check: runs whose (outcome, cause) differ from the first run's}} (a row absent in a
    run, or a run that could not examine the target, counts as a flip)."""
    first = runs[0]
    out = {}
    for name in first:
        base = first[name].get("rows", {})
        checks = set(base).union(*(r.get(name, {}).get("rows", {}) for r in runs[1:]))
        out[name] = {c: sum(r.get(name, {}).get("rows", {}).get(c) != base.get(c) for r in runs[1:]) for c in sorted(checks)}
        out[name]["(error)"] = sum(("error" in r.get(name, {"error": 1})) != ("error" in first[name]) for r in runs[1:])
    return out


def _busy(k: int, seconds: float) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", SPIN.format(s=seconds)]) for _ in range(k)]


def run(names: list[str], n: int, k: int, busy_seconds: float, timeout: float = 1800) -> tuple[list[dict], float]:
    """n runs of the worker, each a subprocess, beside k busy processes: (the runs, wall seconds)."""
    spinners = _busy(k, busy_seconds)
    t0 = time.time()
    runs = []
    try:
        for i in range(n):
            p = subprocess.run([sys.executable, "-m", "doctor_lab.stability", "--worker", ",".join(names)], cwd=ROOT,
                               capture_output=True, text=True, timeout=timeout)
            got = [ln[5:] for ln in p.stdout.splitlines() if ln.startswith("JSON:")]
            if p.returncode or not got:
                raise RuntimeError(f"run {i + 1} exited {p.returncode}: {(p.stderr.strip().splitlines() or ['-'])[-1]}")
            runs.append(json.loads(got[0]))
            print(f"  run {i + 1}/{n}: {time.time() - t0:.0f} s", flush=True)
    finally:
        for s in spinners:   # the spinners stop by themselves; these are ours, ended early when done
            s.terminate()
            s.wait()
    return runs, time.time() - t0


def report(runs: list[dict], k: int, wall: float) -> tuple[str, int]:
    """The per-target lines and the totals; the total flip count."""
    f = flips(runs)
    lines, total = [], 0
    for name, by_check in f.items():
        n = sum(by_check.values())
        total += n
        codes = sorted({r[name].get("exit_code", "error") for r in runs}, key=str)
        moved = ", ".join(f"{c} {v}" for c, v in by_check.items() if v) or "none"
        lines.append(f"{name:14s} flips {n}  exit codes seen {codes}  moved: {moved}")
    checks = sum(len(v) - 1 for v in f.values())
    lines.append(f"total: {total} flips over {len(runs)} runs x {len(f)} targets ({checks} target-checks) "
                 f"beside {k} busy processes, {wall:.0f} s wall")
    return "\n".join(lines), total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m doctor_lab.stability", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--busy", type=int, default=2, help="busy processes beside the runs")
    p.add_argument("--busy-seconds", type=float, default=3600, help="each busy process stops by itself after this")
    p.add_argument("--targets", default="all", help="comma-separated names (default: every healthy target)")
    p.add_argument("--out", default=None, help="keep the runs as JSON here")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print("JSON:" + json.dumps(worker(args.worker.split(","))))
        return 0
    known = targets()
    names = list(known) if args.targets == "all" else [t for t in args.targets.split(",") if t]
    unknown = [t for t in names if t not in known]
    if unknown or args.runs < 2:
        print(f"stability: {'unknown target(s) ' + ', '.join(unknown) if unknown else '--runs needs 2 or more'} "
              f"(targets: {', '.join(known)})", file=sys.stderr)
        return 2
    print(f"{len(names)} healthy targets x {args.runs} runs beside {args.busy} busy processes")
    try:
        runs, wall = run(names, args.runs, args.busy, args.busy_seconds)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"stability: {e}", file=sys.stderr)
        return 2
    text, total = report(runs, args.busy, wall)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps({"runs": runs, "busy": args.busy, "wall_s": wall}, indent=1) + "\n")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
