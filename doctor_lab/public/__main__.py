"""python -m doctor_lab.public [--source NAME=PATH ...] [--only NAME,...] [--out DIR] [--timeout S]

Each target of records.TARGETS examined bare, as a user types it, in a subprocess of its own
(`PYTHONPATH=CHECKOUT python -m attention_doctor FACTORY.py:FN --json F`, one thread), one at a
time; each Expect judged right or wrong against what the run measured. A target whose source is
not given, or lacks the class's file, is "not measured" (never right); a run past --timeout makes
its rows wrong ("timed out"). Exit
0: every target measured and right; 1: a row wrong; 3: nothing wrong, a target not measured.
--out DIR writes DIR/table.json and DIR/table.md (results/doctor/public to commit them: beside, not
in, results/doctor, whose JSON files are the validation's)."""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from doctor_lab.public.records import CALLER, EXIT, SOURCE, TARGETS, Expect, Target

ROOT = Path(__file__).resolve().parents[2]
RIGHT, WRONG = "right", "wrong"


def not_measured(target: Target, sources: dict[str, str]) -> str:
    """Why the target cannot be measured here, or "" when it can."""
    if target.needs and importlib.util.find_spec(target.needs) is None:
        return f"not measured: {target.needs} is not installed (pip install -r requirements-validation.txt)"
    if not target.source:
        return ""
    src = SOURCE[target.source]
    path = sources.get(src.name)
    if path is None:
        return f"not measured: pass --source {src.name}=PATH ({src.clone()})"
    if not (Path(path) / target.file).is_file():
        return f"not measured: {path} has no {target.file} (git -C {path} checkout {src.commit[:12]})"
    return ""


def provenance(target: Target, path: str | None) -> dict:
    if not target.source:
        from importlib.metadata import version
        return {"package": f"{target.needs}=={version(target.needs)}"}
    src = SOURCE[target.source]
    git = lambda *a: subprocess.run(["git", "-C", path, *a], capture_output=True, text=True).stdout.strip()  # noqa: E731
    commit = git("rev-parse", "HEAD") or "unknown (not a git checkout)"
    return {"repo": f"github.com/{src.repo}", "commit": commit, "record_commit": src.commit,
            "same_commit": commit == src.commit, "file_changed": bool(git("status", "--porcelain", "--", target.file))}


def _subprocess(args: list[str], path: str | None, doctor: Path | None, timeout: float):
    """`python -m ARGS` with the checkout first on PYTHONPATH, one thread, in this tree; with
    `doctor`, in that folder instead (its attention_doctor comes first, as `python -m` puts the
    working directory first) with this tree after the checkout (the factories, doctor_lab)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    paths = [str(Path(path).resolve())] if path else []
    paths += [str(ROOT)] if doctor else []
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*paths, os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", *args], cwd=doctor or ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _target(target: Target, doctor: Path | None) -> str:
    t = target.target()
    return str(ROOT / t) if doctor and ".py:" in t else t


def typed(target: Target) -> str:
    """The command as a user types it (the checkout's path as <NAME>)."""
    head = f"PYTHONPATH=<{target.source}> " if target.source else ""
    return head + " ".join(["python -m attention_doctor", target.target(), *target.cli_args])


def run_cli(target: Target, path: str | None, timeout: float, doctor: Path | None = None) -> dict:
    """One bare run: its exit code, seconds, the machine's load, and each check's row (from --json;
    the detail of the rows judged)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        args = ["attention_doctor", _target(target, doctor), *target.cli_args, "--json", str(out)]
        load, t0 = os.getloadavg()[0], time.time()
        try:
            p = _subprocess(args, path, doctor, timeout)
        except subprocess.TimeoutExpired:
            return {"timed_out": timeout, "seconds": round(time.time() - t0, 1), "load": load}
        run = {"exit_code": p.returncode, "seconds": round(time.time() - t0, 1), "load": round(load, 2)}
        if out.is_file():
            rows = json.loads(out.read_text())["checks"]
            judged = {e.check for e in target.expects}
            keep = ("outcome", "cause", "measured", "reason")
            run["checks"] = {r["name"]: {k: r[k] for k in keep} | ({"detail": r["detail"]} if r["name"] in judged else {})
                             for r in rows}
        else:
            run["stderr"] = (p.stderr.strip().splitlines() or [""])[-1]
        return run


def run_caller(target: Target, path: str | None, timeout: float, doctor: Path | None = None) -> dict:
    try:
        p = _subprocess(["doctor_lab.public.caller", _target(target, doctor)], path, doctor, timeout)
    except subprocess.TimeoutExpired:
        return {"timed_out": timeout}
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def measured(expect: Expect, run: dict, caller: dict | None) -> tuple[str, str]:
    """(the outcome to judge, what is shown) for one Expect in one run."""
    if expect.check == CALLER:
        if caller is None or "unchanged" not in caller:
            return "", f"no probe ({(caller or {}).get('error') or (caller or {}).get('timed_out') or 'not run'})"
        if caller["unchanged"]:
            return "unchanged", f"unchanged (complex buffers: {', '.join(caller['complex_buffers']) or 'none'})"
        diffs = caller["differences"]
        modes = sum(": training " in d for d in diffs)
        complex_ = [d for d in diffs if d.split(":")[0] in caller["complex_buffers"]]
        return "changed", (f"changed: {modes} modules' mode, {len(diffs) - modes} tensors"
                           + "".join(f"; {d}" for d in complex_))
    if "timed_out" in run:
        return "", f"timed out after {run['timed_out']} s"
    if expect.check == EXIT:
        return str(run["exit_code"]), f"exit {run['exit_code']}"
    row = run.get("checks", {}).get(expect.check)
    if row is None:
        return "", f"no row (exit {run['exit_code']}: {run.get('stderr', '')})"
    value = row["measured"]
    shown = " ".join(s for s in (row["outcome"], row["cause"] or row["reason"],
                                 f"{value:.3g}" if isinstance(value, float) else "") if s)
    return row["outcome"], shown


def judge(expect: Expect, runs: list[dict], caller: dict | None) -> dict:
    """Right only where every run's outcome is among the right ones (with its cause, if named)."""
    seen = [measured(expect, r, caller) for r in ([{}] if expect.check == CALLER else runs)]
    causes = [(r.get("checks", {}).get(expect.check) or {}).get("cause", "") for r in runs]
    ok = all(o in expect.right for o, _ in seen) and (not expect.cause or all(c == expect.cause for c in causes))
    right = "/".join(expect.right) + (f" ({expect.cause})" if expect.cause else "")
    return {"check": expect.check, "right": right, "measured": [s for _, s in seen], "verdict": RIGHT if ok else WRONG,
            "why": expect.why}


def examine_target(target: Target, sources: dict[str, str], timeout: float, doctor: Path | None = None) -> dict:
    record = {"name": target.name, "row": target.row, "command": typed(target), "file": target.file,
              "built": target.built, "stubs": list(target.stubs()), "planted": target.planted}
    why_not = not_measured(target, sources)
    if why_not:
        return {**record, "status": why_not,
                "verdicts": [{"check": e.check, "right": "/".join(e.right), "measured": [], "verdict": why_not,
                              "why": e.why} for e in target.expects]}
    path = sources.get(target.source)
    runs = [run_cli(target, path, timeout, doctor) for _ in range(target.repeats)]
    caller = run_caller(target, path, timeout, doctor) if any(e.check == CALLER for e in target.expects) else None
    verdicts = [judge(e, runs, caller) for e in target.expects]
    return {**record, "status": "measured", "provenance": provenance(target, path), "runs": runs, "caller": caller,
            "verdicts": verdicts}


def markdown(data: dict) -> str:
    lines = ["# Issue 61's table on the public classes, bare from the command line",
             "", f"Written by `{data['command']}` (doctor_lab/public/records.py: each "
             "target's build, stubs and why each outcome is right). "
             f"The doctor: {data['doctor']}; torch {data['env']['torch']}, transformers {data['env']['transformers']}, "
             "one thread per run.", "",
             "| target | check | right | measured | verdict |", "|---|---|---|---|---|"]
    for t in data["targets"]:
        for v in t["verdicts"]:
            shown = "; ".join(dict.fromkeys(v["measured"])) if v["measured"] else "-"
            lines.append(f"| {t['name']} | {v['check']} | {v['right']} | {shown} | {v['verdict']} |")
    lines += ["", "## Targets", ""]
    for t in data["targets"]:
        prov = t.get("provenance", {})
        where = (f"{prov.get('repo')} at {prov.get('commit', '')[:12]}" if "repo" in prov else prov.get("package", ""))
        runs = ", ".join(f"exit {r.get('exit_code', 'timeout')} in {r['seconds']} s (load {r['load']})"
                         for r in t.get("runs", []))
        lines.append(f"- **{t['name']}** ({t['row']}): `{t['command']}`; {t['file']}" + (f", {where}" if where else "")
                     + f"; built: {t['built']}" + (f"; planted: {t['planted']}" if t["planted"] else "")
                     + (f"; stubbed (unused): {', '.join(t['stubs'])}" if t["stubs"] else "")
                     + (f"; runs: {runs}" if runs else f"; {t['status']}"))
        for name, row in (t["runs"][0].get("checks", {}) if t.get("runs") else {}).items():
            if row.get("detail") and row["outcome"] == "fail":   # a fail's witness, as the doctor words it
                lines.append(f"  - {name} {row['cause']}: {row['detail']}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m doctor_lab.public", description=__doc__.split("\n\n")[1])
    ap.add_argument("--source", action="append", default=[], metavar="NAME=PATH",
                    help="a checkout of a public codebase: " + ", ".join(SOURCE))
    ap.add_argument("--only", default="", help="comma-separated target names (default: all)")
    ap.add_argument("--out", type=Path, help="write OUT/table.json and OUT/table.md")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run (default 600)")
    ap.add_argument("--doctor", type=Path, help="a folder holding another doctor's attention_doctor package, run in "
                                                "place of this tree's (git archive COMMIT attention_doctor | tar -x -C DIR)")
    a = ap.parse_args(argv)
    sources = {}
    for s in a.source:
        name, sep, path = s.partition("=")
        if not sep or name not in SOURCE:
            ap.error(f"--source {s}: NAME=PATH with NAME one of {', '.join(SOURCE)}")
        sources[name] = path
    names = [n for n in a.only.split(",") if n]
    unknown = [n for n in names if n not in {t.name for t in TARGETS}]
    if unknown:
        ap.error(f"--only: unknown target {', '.join(unknown)} (known: {', '.join(t.name for t in TARGETS)})")
    results = []
    for t in TARGETS:
        if names and t.name not in names:
            continue
        r = examine_target(t, sources, a.timeout, a.doctor and a.doctor.resolve())
        results.append(r)
        print(f"{t.name}: {r['status']}" + (f" ({t.row})" if r["status"] == "measured" else ""), flush=True)
        for v in r["verdicts"]:
            if r["status"] == "measured":
                print(f"  {v['verdict']:5}  {v['check']:18} right {v['right']:28} measured {'; '.join(v['measured'])}")
    command = " ".join(["python -m doctor_lab.public", *(f"--source {n}=PATH" for n in sources),
                        *([f"--doctor DIR/{a.doctor.name}"] if a.doctor else []), *([f"--out {a.out}"] if a.out else [])])
    data = {"command": command, "env": _versions(), "doctor": _doctor(a.doctor), "sources": {s.name: {"repo": s.repo, "commit": s.commit, "why": s.why_commit}
                                            for s in SOURCE.values()}, "targets": results}
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "table.json").write_text(json.dumps(data, indent=1) + "\n")
        (a.out / "table.md").write_text(markdown(data))
        print(f"wrote {a.out / 'table.json'} and {a.out / 'table.md'}")
    verdicts = [v["verdict"] for r in results for v in r["verdicts"]]
    return 1 if WRONG in verdicts else 3 if any(r["status"] != "measured" for r in results) else 0


def _doctor(doctor: Path | None) -> str:
    """Which doctor ran: this tree's commit (and whether attention_doctor/ has local changes), or the folder given."""
    if doctor:
        return f"attention_doctor from a folder {doctor.name}"
    git = lambda *a: subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True).stdout.strip()  # noqa: E731
    return git("rev-parse", "HEAD")[:12] + (" + local changes" if git("status", "--porcelain", "attention_doctor") else "")


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    out = {"python": sys.version.split()[0]}
    for pkg in ("torch", "transformers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "absent"
    return out


if __name__ == "__main__":
    sys.exit(main())
