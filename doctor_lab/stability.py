"""The gate does not move: every healthy target of the test beds (doctor_lab/styles: each style's
healthy model; doctor_lab/styles/classic.py: the classic four; doctor_lab/hand_caches: each cache
convention's healthy model; with --generated N, N healthy styles of the generated bed drawn by
combos.healthy_cover, every axis value among them) examined N times, each run in a
process of its own as a CI job is, beside K busy processes (each a CPU spin that stops by itself
after --busy-seconds), and the outcomes compared: a flip is a run whose (outcome, cause) of a
target's check differs from the first run's.

    python -m doctor_lab.stability                       # 10 runs beside 2 busy processes, every target
    python -m doctor_lab.stability --runs 3 --busy 1 --targets gpt_fast,nanogpt
    python -m doctor_lab.stability --generated 12 --seed 0   # and 12 of the generated bed's healthy styles

Prints one line per target (its flips, the exit codes its runs gave), then the totals; exits 1
if anything flipped or a healthy target's run exited other than 0 or 3 (pass, or inconclusive), its
exit code judged as a maintainer's CI judges it: against the hazards its bed documents for its formula
as a baseline (hazards(); the codes without them are printed beside). --out FILE keeps the runs as JSON. Torch runs in the children with the
threads torch chooses (the reordering across threads a loaded machine gives is what is measured)."""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from doctor_lab.report.stability import exit_codes, flips, totals

ROOT = Path(__file__).resolve().parents[1]
SPIN = "import time\nend = time.time() + {s}\nx = 0\nwhile time.time() < end:\n    x += 1\n"


# the hand-written caches' healthy targets: name -> (module of doctor_lab/hand_caches, its factory)
HAND_CACHES = {"own_cache": ("own_cache", "healthy"), "input_pos": ("input_pos", "healthy"),
               **{f"presents_{lay}": ("presents", f"{lay}_healthy") for lay in ("kv", "latent", "olmo")}}
GENERATED = "generated:"   # a generated style's name: this prefix, then its id with '.' for ',' (--targets splits on ',')


def generated_names(n: int, seed: int) -> list[str]:
    from doctor_lab.generated.combos import healthy_cover
    return [GENERATED + s.id.replace(",", ".") for s in healthy_cover(n, seed)]


def _a_generated_style(name: str) -> bool:
    """name is GENERATED + a valid style's id ('.' for ','): --targets may name one not drawn."""
    from doctor_lab.generated.combos import Style, valid
    try:
        return name.startswith(GENERATED) and valid(Style.parse(name[len(GENERATED):].replace(".", ",")))
    except (KeyError, ValueError):
        return False


def targets(generated: int = 0, seed: int = 0) -> dict[str, str]:
    """{name: bed} of the beds' healthy targets: each style's (styles), the classic four (classic),
    each cache convention's (hand_caches), and `generated` healthy styles of the generated bed
    (combos.healthy_cover(generated, seed))."""
    from doctor_lab.styles import STYLES
    from doctor_lab.styles.classic import STYLES as CLASSIC
    return {**{s: "styles" for s in STYLES}, **{s: "classic" for s in CLASSIC}, **dict.fromkeys(HAND_CACHES, "hand_caches"),
            **dict.fromkeys(generated_names(generated, seed) if generated else [], "generated")}


def build(name: str):
    if name.startswith(GENERATED):
        from doctor_lab.generated.combos import HEALTHY, Style
        from doctor_lab.generated.lm import build as build_generated
        return build_generated(Style.parse(name[len(GENERATED):].replace(".", ",")), HEALTHY)
    if name in HAND_CACHES:
        from doctor_lab.hand_caches import input_pos, own_cache, presents
        module, factory = HAND_CACHES[name]
        return getattr({"own_cache": own_cache, "input_pos": input_pos, "presents": presents}[module], factory)()
    from doctor_lab.styles.classic import STYLES as CLASSIC
    if name in CLASSIC:
        from doctor_lab.styles import classic
        return classic.build(name)
    from doctor_lab.styles import build as build_style
    return build_style(name)


def hazards(name: str) -> tuple[tuple[str, str], ...]:
    """The (check, cause) rows a healthy target fails by its own formula, as its bed documents them
    (a style's HAZARDS: q k^T formed before the scale, as Meta's Llama and nanoGPT write it, overflows
    float16 first); the hand-written caches and the generated bed's healthy styles declare none."""
    if name.startswith(GENERATED) or name in HAND_CACHES:
        return ()
    from doctor_lab.styles import STYLES
    from doctor_lab.styles.classic import STYLES as CLASSIC
    return tuple(getattr(STYLES.get(name) or CLASSIC[name], "HAZARDS", ()))


def baseline(name: str):
    """A target's hazards as the baseline a maintainer keeps beside such a model (None: none): the gate
    reads the exit code judged against it, so a documented hazard is expected and anything else is not."""
    from attention_doctor.baseline import Baseline, Expected
    found = hazards(name)
    return Baseline([Expected(check, (cause,), "a hazard of this formula, documented by its bed")
                     for check, cause in found]) if found else None


def worker(names: list[str]) -> dict:
    """One run: {target: {"exit_code": int, "bare_exit_code": int, "rows": {check: [outcome, cause]}}}:
    exit_code judged against the target's documented hazards (baseline()), bare_exit_code without them
    (a target that cannot be examined: {"error": its one line})."""
    from attention_doctor import TargetError, examine
    out = {}
    for name in names:
        try:
            r = examine(build(name), name=name)
        except TargetError as e:
            out[name] = {"error": str(e)}
            continue
        bare = r.exit_code
        r.baseline = baseline(name)
        out[name] = {"exit_code": r.exit_code, "bare_exit_code": bare,
                     "rows": {c.name: [c.outcome.value, c.cause] for c in r.checks}}
    return out


def _busy(k: int, seconds: float) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", SPIN.format(s=seconds)]) for _ in range(k)]


def run(names: list[str], n: int, k: int, busy_seconds: float, timeout: float = 1800
        ) -> tuple[list[dict], float, list[float]]:
    """n runs of the worker, each a subprocess, beside k busy processes: (the runs, wall seconds, the
    1-minute load average at the end of each run: the load the runs met, whatever made it)."""
    spinners = _busy(k, busy_seconds)
    t0 = time.time()
    runs, loads = [], []
    try:
        for i in range(n):
            p = subprocess.run([sys.executable, "-m", "doctor_lab.stability", "--worker", ",".join(names)], cwd=ROOT,
                               capture_output=True, text=True, timeout=timeout)
            got = [ln[5:] for ln in p.stdout.splitlines() if ln.startswith("JSON:")]
            if p.returncode or not got:
                raise RuntimeError(f"run {i + 1} exited {p.returncode}: {(p.stderr.strip().splitlines() or ['-'])[-1]}")
            runs.append(json.loads(got[0]))
            loads.append(os.getloadavg()[0])
            print(f"  run {i + 1}/{n}: {time.time() - t0:.0f} s, load {loads[-1]:.1f}", flush=True)
    finally:
        for s in spinners:   # the spinners stop by themselves; these are ours, ended early when done
            s.terminate()
            s.wait()
    return runs, time.time() - t0, loads


def report(runs: list[dict], k: int, wall: float, loads: list[float] = ()) -> tuple[str, int]:
    """The per-target lines and the totals; the flips plus the target-runs that exited other than
    HEALTHY_EXITS (or could not examine)."""
    f = flips(runs)
    lines, total = [], 0
    for name, by_check in f.items():
        n = sum(by_check.values())
        total += n
        codes, bare = exit_codes(runs, name), exit_codes(runs, name, "bare_exit_code")
        moved = ", ".join(f"{c} {v}" for c, v in by_check.items() if v) or "none"
        lines.append(f"{name:14s} flips {n}  exit codes seen {codes}" + (f" (without its hazards {bare})" if bare != codes else "")
                     + f"  moved: {moved}")
    _, checks, off = totals(runs)
    lines.append(f"total: {total} flips over {len(runs)} runs x {len(f)} targets ({checks} target-checks) "
                 f"beside {k} busy processes, {wall:.0f} s wall; {off} target-runs exited other than 0 or 3"
                 + (f"; load average at the runs' ends {min(loads):.1f}..{max(loads):.1f} on {os.cpu_count()} CPUs"
                    if loads else ""))
    return "\n".join(lines), total + off


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m doctor_lab.stability", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--busy", type=int, default=2, help="busy processes beside the runs")
    p.add_argument("--busy-seconds", type=float, default=3600, help="each busy process stops by itself after this")
    p.add_argument("--targets", default="all", help="comma-separated names (default: every healthy target)")
    p.add_argument("--generated", type=int, default=0, metavar="N",
                   help="also N healthy styles of the generated bed, every axis value among them (at least 6)")
    p.add_argument("--seed", type=int, default=0, help="the generated styles' draw (default 0)")
    p.add_argument("--out", default=None, help="keep the runs as JSON here")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print("JSON:" + json.dumps(worker(args.worker.split(","))))
        return 0
    try:
        known = targets(args.generated, args.seed)
    except ValueError as e:   # too few generated styles to hold every axis value
        print(f"stability: --generated: {e}", file=sys.stderr)
        return 2
    names = list(known) if args.targets == "all" else [t for t in args.targets.split(",") if t]
    unknown = [t for t in names if t not in known and not _a_generated_style(t)]
    if unknown or args.runs < 2:
        print(f"stability: {'unknown target(s) ' + ', '.join(unknown) if unknown else '--runs needs 2 or more'} "
              f"(targets: {', '.join(known)})", file=sys.stderr)
        return 2
    print(f"{len(names)} healthy targets x {args.runs} runs beside {args.busy} busy processes")
    try:
        runs, wall, loads = run(names, args.runs, args.busy, args.busy_seconds)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"stability: {e}", file=sys.stderr)
        return 2
    text, total = report(runs, args.busy, wall, loads)
    print(text)
    if args.out:
        from doctor_lab.zoo.runner import doctor_hash
        command = " ".join(["python -m doctor_lab.stability", *(argv if argv is not None else sys.argv[1:])])
        Path(args.out).write_text(json.dumps({"command": command, "doctor": doctor_hash(), "beds": {n: known.get(n, "generated") for n in names},
                                               "runs": runs, "busy": args.busy, "wall_s": wall, "load": loads,
                                               "cpus": os.cpu_count()}, indent=1) + "\n")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
