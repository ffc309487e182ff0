"""Run each repro of the record on its releases: the release before (exit 0), the introducing release
(exit 1) and the fixing release (exit 0), each installed in isolation (releases.py, cached; of the
entry's library).

    python -m doctor_lab.backtest.verify                      # every entry with a repro
    python -m doctor_lab.backtest.verify gpt_sdpa_cache_no_mask --pinned DIR
    python -m doctor_lab.backtest.verify --history            # also the releases measured while bisecting
    python -m doctor_lab.backtest.verify --write              # put the measured codes in record.yaml

Prints a table (id, release, expected, measured, the repro's last line) and exits 1 on any mismatch,
2 on bad input. A repro exits 2 when it could not run, which is never a match."""
import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from doctor_lab.backtest import record as rec
from doctor_lab.backtest import releases

TIMEOUT_S = 900  # a repro takes seconds; flex_attention and a loaded machine can take minutes


@dataclass(frozen=True)
class Run:
    id: str
    release: str
    expected: int
    code: int
    line: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.code == self.expected


def run_repro(repro: Path, release_dir: Path) -> tuple[int, str]:
    """Exit code and last line of output of one repro with one release first on the path."""
    env = {**os.environ, "PYTHONPATH": str(release_dir), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONWARNINGS": "ignore"}
    try:
        r = subprocess.run([sys.executable, str(repro)], capture_output=True, text=True, env=env,
                           timeout=TIMEOUT_S, cwd=repro.parent)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {TIMEOUT_S} s"
    lines = (r.stdout.strip() or r.stderr.strip() or "(no output)").splitlines()
    return r.returncode, lines[-1][:160]


def verify(entry: rec.Regression, pinned: Path, history: bool) -> list[Run]:
    wanted = list(entry.releases)
    if history:
        wanted += [r for r in sorted(entry.history, key=Version) if r not in wanted]
    runs = []
    for release in wanted:
        expected = entry.history[release] if release in entry.history and release not in entry.releases \
            else entry.expected(release)
        t0 = time.monotonic()
        d = releases.install(release, pinned, log=lambda m: print(f"  {m}", flush=True), library=entry.library)
        code, line = run_repro(entry.repro, d)
        runs.append(Run(entry.id, release, expected, code, line, time.monotonic() - t0))
        r = runs[-1]
        print(f"{r.id:38} {r.release:8} expect {r.expected} got {r.code} {'ok ' if r.ok else 'BAD'} "
              f"{r.seconds:5.0f}s  {r.line}", flush=True)
    return runs


def write_verified(path: Path, runs: list[Run]) -> None:
    """Replace each verified entry's `verified:` line with what was measured on its three releases."""
    text = path.read_text()
    by_id: dict[str, dict[str, int]] = {}
    for r in runs:
        by_id.setdefault(r.id, {})[r.release] = r.code
    for ident, codes in by_id.items():
        block = re.search(rf"(?ms)^- id: {re.escape(ident)}\n.*?(?=^- id: |\Z)", text)
        if not block:
            continue
        entry_text = block.group(0)
        keep = {k: v for k, v in codes.items()}
        line = "  verified: {" + ", ".join(f'"{k}": {v}' for k, v in keep.items()) + "}\n"
        new = re.sub(r"(?m)^  verified:.*\n", line, entry_text, count=1)
        text = text.replace(entry_text, new)
    path.write_text(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m doctor_lab.backtest.verify", description=__doc__.split("\n\n")[0])
    p.add_argument("ids", nargs="*", help="entries to verify (default: every entry with a repro)")
    p.add_argument("--pinned", type=Path, default=releases.DEFAULT_PINNED,
                   help="where releases are installed, DIR/tf-VERSION (default %(default)s)")
    p.add_argument("--history", action="store_true", help="also run the releases measured while bisecting")
    p.add_argument("--write", action="store_true", help="write the measured exit codes into record.yaml")
    a = p.parse_args(argv)
    try:
        entries = rec.load()
    except rec.RecordError as e:
        print(f"verify: {e}", file=sys.stderr)
        return 2
    known = {e.id: e for e in entries}
    unknown = [i for i in a.ids if i not in known]
    if unknown:
        print(f"verify: no entry {', '.join(unknown)} in {rec.RECORD}", file=sys.stderr)
        return 2
    chosen = [known[i] for i in a.ids] if a.ids else [e for e in entries if e.repro]
    without = [e.id for e in chosen if not e.repro]
    if without:
        print(f"verify: no repro for {', '.join(without)} (see their no_repro)", file=sys.stderr)
        return 2
    runs = []
    for e in chosen:
        try:
            runs += verify(e, a.pinned, a.history)
        except RuntimeError as err:  # an install that failed: reported, and a mismatch
            print(f"{e.id}: {err}", flush=True)
            runs.append(Run(e.id, "?", 0, 2, str(err)[:160], 0.0))
    bad = [r for r in runs if not r.ok]
    print(f"\n{len(runs) - len(bad)} of {len(runs)} runs as expected ({len(chosen)} entries)"
          + ("; mismatches: " + ", ".join(f"{r.id}@{r.release}" for r in bad) if bad else ""))
    if a.write:
        write_verified(rec.RECORD, [r for r in runs if r.release in known[r.id].releases])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
