"""Today's doctor on every planted case of the styles bed, bare from the command line, as a user
runs it: `python -m attention_doctor TARGET --json FILE` in a subprocess per case. Each case is
judged against its record: a healthy model should exit 0 (or 3 naming a limit of the target), a
planted bug exit 1 with each expected check failing with its documented cause, and no run prints
a traceback. Prints one line per case and the counts by outcome; `--write` renders BASELINE.md.

    python -m doctor_lab.styles.measure                           # every case, about an hour on 2 cores
    python -m doctor_lab.styles.measure --only flex_mask,llama --out /tmp/bed --reuse
    python -m doctor_lab.styles.measure --out /tmp/bed --reuse --write doctor_lab/styles/BASELINE.md

Each run's record (exit code, traceback or not, stderr's tail, the doctor's JSON) is kept in
--out as STYLE__BUG.json; --reuse takes a record already there instead of running it again."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from attention_doctor.result import FAIL, NA, PASS, Row
from doctor_lab.styles import CASES

ROOT = Path(__file__).resolve().parents[2]
EXPECTED, HEALTHY_INCONCLUSIVE = "expected", "healthy: exit 3"


def run_case(case, out: Path, timeout: int) -> dict:
    """One doctor run: its record, written to out."""
    rows_file = out / f"{case.style}__{case.bug or 'healthy'}.doctor.json"
    rows_file.unlink(missing_ok=True)
    start = time.time()
    try:
        p = subprocess.run([sys.executable, "-m", "attention_doctor", case.target, "--json", str(rows_file)],
                           cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        rc, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:   # a run past the limit is its own outcome, never a pass
        rc = None
        text = "".join(t.decode(errors="replace") if isinstance(t, bytes) else (t or "") for t in (e.stdout, e.stderr))
    record = {"target": case.target, "rc": rc, "wall_s": round(time.time() - start, 1),
              "traceback": "Traceback (most recent call last)" in text, "tail": text.strip().splitlines()[-3:],
              "result": json.loads(rows_file.read_text()) if rows_file.is_file() else None}
    (out / f"{case.style}__{case.bug or 'healthy'}.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def row_outcome(record, check) -> tuple[str, str]:
    """(outcome, cause) of one check in a run; ("missing", "") where the run gave no such row."""
    for r in (record["result"] or {}).get("checks", []):
        if r["name"] == check:
            return Row.from_dict(r).outcome.value, r.get("cause", "")
    return "missing", ""


def judge(case, record) -> str:
    """The case's outcome: `expected`, or what went wrong first (one short name per kind)."""
    if record["rc"] is None:
        return "timeout"
    if record["traceback"]:
        return "traceback"
    if record["rc"] == 2:
        return "exit 2 (unusable)"
    if case.bug is None:   # exit 0, or 1 with exactly its style's hazards failing
        failed = {(r["name"], r.get("cause", "")) for r in (record["result"] or {}).get("checks", [])
                  if Row.from_dict(r).outcome is FAIL}
        if failed == set(case.expects):
            return {0: EXPECTED, 1: EXPECTED, 3: HEALTHY_INCONCLUSIVE}.get(record["rc"], f"healthy: exit {record['rc']}")
        return f"healthy: exit {record['rc']}"
    for check, cause in case.expects:
        outcome, got = row_outcome(record, check)
        if outcome != "fail":
            return {"pass": "missed (pass)", "warn": "missed (warn)"}.get(outcome, outcome)
        if cause and got != cause:
            return "fail, another cause"
    return EXPECTED if record["rc"] == 1 else f"exit {record['rc']}"


def not_passing(record) -> str:
    """A healthy run's rows other than pass and n/a, as `check outcome (cause)`."""
    rows = [Row.from_dict(r) for r in (record["result"] or {}).get("checks", [])]
    return "; ".join(f"{r.name} {r.outcome}" + (f" ({r.cause})" if r.cause else "")
                     for r in rows if r.outcome not in (PASS, NA)) or "-"


def table(cases, records) -> str:
    """BASELINE.md: the counts by outcome, then one row per case."""
    kinds = Counter(judge(c, records[c.id]) for c in cases)
    bugs = [c for c in cases if c.bug]
    lines = ["# The styles bed under today's doctor", "",
             "Written by `python -m doctor_lab.styles.measure --write doctor_lab/styles/BASELINE.md` from the "
             "records in `doctor_lab/styles/__init__.py`; every run is `python -m attention_doctor "
             "doctor_lab.styles.STYLE:BUG --json FILE`, bare. A planted bug is `expected` when the run exits 1 "
             "and every expected check fails with its documented cause; a healthy model when it exits 0 (or 1 "
             "with exactly the hazards of its project's formula failing, recorded as such).", "",
             f"{len(cases)} runs ({len(cases) - len(bugs)} healthy, {len(bugs)} planted bugs): "
             + "; ".join(f"{k} {n}" for k, n in kinds.most_common()) + f". The {sum(not c.planted for c in CASES)} "
             "(style, bug) pairs a style's interface cannot express are not run; each style module's CANNOT says why.", "",
             "| style | bug | expected (check: cause) | exit | that check today | traceback | outcome |",
             "|---|---|---|---|---|---|---|"]
    for c in cases:
        rec = records[c.id]
        if c.bug is None:
            want = "exit 0" + "".join(f"; hazard {ch}: {cause}" for ch, cause in c.expects)
            got = not_passing(rec)
        else:
            want = "; ".join(f"{ch}: {cause}" for ch, cause in c.expects)
            got = "; ".join("{} {}{}".format(ch, *((o, f" ({k})") if k else (o, ""))) for ch, o, k in
                            ((ch, *row_outcome(rec, ch)) for ch, _ in c.expects))
        lines.append(f"| {c.style} | {c.bug or 'healthy'} | {want} | {rec['rc'] if rec['rc'] is not None else 'timeout'} "
                     f"| {got} | {'yes' if rec['traceback'] else 'no'} | {judge(c, rec)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m doctor_lab.styles.measure", description=__doc__.splitlines()[0])
    p.add_argument("--only", default=None, help="comma-separated styles (default: all)")
    p.add_argument("--out", default=None, help="where each run's record goes (default: a new temporary directory)")
    p.add_argument("--reuse", action="store_true", help="take a record already in --out instead of running it again")
    p.add_argument("--timeout", type=int, default=1200, help="seconds per doctor run")
    p.add_argument("--write", default=None, metavar="FILE", help="render the table (BASELINE.md) to FILE")
    args = p.parse_args(argv)
    only = None if args.only is None else set(args.only.split(","))
    cases = [c for c in CASES if c.planted and (only is None or c.style in only)]
    if not cases:
        print(f"no case of style(s) {args.only}", file=sys.stderr)
        return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="styles_bed_"))
    out.mkdir(parents=True, exist_ok=True)
    records = {}
    for c in cases:
        saved = out / f"{c.style}__{c.bug or 'healthy'}.json"
        records[c.id] = json.loads(saved.read_text()) if args.reuse and saved.is_file() else run_case(c, out, args.timeout)
        rec = records[c.id]
        print(f"{c.id:45s} exit {rec['rc']!s:4s} {rec['wall_s']:6.1f} s  traceback {'yes' if rec['traceback'] else 'no ':3s}"
              f"  {judge(c, rec)}", flush=True)
    kinds = Counter(judge(c, records[c.id]) for c in cases)
    print(f"{len(cases)} runs in {sum(r['wall_s'] for r in records.values()):.0f} s; records in {out}")
    for kind, n in kinds.most_common():
        print(f"  {n:3d}  {kind}")
    if args.write:
        Path(args.write).write_text(table(cases, records))
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
