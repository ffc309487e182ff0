"""The backtest, one command: for each regression of record.yaml, the doctor on its architectures x
implementations on the release before it, the one that introduced it and the one that fixed it, each
release installed in isolation; then the table and the recall.

    python -m doctor_lab.backtest --pinned DIR            # every entry; releases installed in DIR/tf-VERSION
    python -m doctor_lab.backtest --ids gpt_sdpa_cache_no_mask --pinned DIR
    python -m doctor_lab.backtest --table                 # only rewrite the table from the runs there are
    python -m doctor_lab.backtest --options --pinned DIR  # each entry's architectures over every option set the
                                                          # option zoo finds (doctor_lab/zoo/options.py), config: unused

Runs go to <out>/runs/<release>/<checks>/ (the zoo's layout; kept: a killed backtest resumes), the
table to <out>/backtest.csv, backtest.json and backtest.md (the whole record, whichever --ids ran).
Exit code 0; 2 on bad input (an unknown id, a record that does not load, a --pinned that cannot be made);
130 when interrupted (rerun the same command: what finished is kept)."""
import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from doctor_lab.backtest import outcomes, plan, record, releases, runner, table
from doctor_lab.zoo.shrink import load_table

OUT = Path("results/backtest")


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m doctor_lab.backtest", description=__doc__.split("\n\n")[0])
    p.add_argument("--ids", nargs="+", metavar="ID", help="entries of record.yaml to run (default: all)")
    p.add_argument("--pinned", type=Path, default=releases.DEFAULT_PINNED,
                   help="where releases are installed, DIR/tf-VERSION (default %(default)s)")
    p.add_argument("--out", type=Path, default=OUT, help="default %(default)s; runs under OUT/runs")
    p.add_argument("--workers", type=int, default=1, help="zoo calls at a time (one release's calls run in turn)")
    p.add_argument("--cpu", type=int, default=300, help="CPU seconds per architecture (the zoo's --cpu)")
    p.add_argument("--no-nearest", action="store_true",
                   help="do not run the nearest checks for an entry whose check is a probe the doctor lacks")
    p.add_argument("--table", action="store_true", help="no installs, no runs: rewrite the table from OUT/runs")
    p.add_argument("--options", action="store_true",
                   help="run the option zoo (every option set found by measurement, on every release the entries "
                        "run, so rows compare like for like) instead of the entries' hand-written config values")
    return p.parse_args(argv)


def fail(msg: str) -> int:
    print(f"backtest: {msg}", file=sys.stderr)
    return 2


def calls(plans: list[plan.Plan], runs: Path) -> dict[Path, list[tuple[str, str, tuple, tuple, tuple]]]:
    """run dir -> its zoo calls (release, arch, impls, checks, config), one per architecture, impls merged."""
    out: dict[Path, dict[str, tuple]] = {}
    for p in plans:
        if not p.checks:
            continue
        for release in p.releases.values():
            d = plan.run_dir(runs, release, p.checks, p.config, p.options)
            for arch in p.entry.architectures:
                have = out.setdefault(d, {}).get(arch, (release, arch, (), p.checks, p.config))
                out[d][arch] = (release, arch, have[2] + tuple(i for i in p.impls if i not in have[2]), p.checks,
                                p.config)
    return {d: list(by.values()) for d, by in out.items()}


def run(plans: list[plan.Plan], a) -> dict:
    """Install every release the plans need, then the zoo calls, `workers` run dirs at a time."""
    todo = calls(plans, a.out / "runs")
    wanted = list(dict.fromkeys(c[0] for cs in todo.values() for c in cs))
    fresh = [v for v in wanted if not releases.installed(a.pinned, v)]
    ok = {v for v in wanted if runner.install(v, a.pinned, a.out / "runs", log=lambda m: print(f"  {m}", flush=True))}
    for v in sorted(set(wanted) - ok):
        print(f"backtest: transformers {v} not installed: {runner.read_install_error(a.out / 'runs', v)}", flush=True)
    n = sum(len(cs) for d, cs in todo.items() if cs[0][0] in ok)
    done, kept = [], []
    shrink = load_table()

    def one_dir(d: Path, extra=()):
        for release, arch, impls, checks, config in todo[d]:
            if release not in ok:
                continue
            if not a.options and runner.current(d, release, arch, impls, checks, shrink, config):
                kept.append(arch)
                continue
            more = extra(d) if callable(extra) else extra
            at = runner.run_arch(release, a.pinned, d, arch, impls, checks, a.cpu, config, more)
            done.append(at)
            print(f"[{len(done) + len(kept)}/{n}] transformers {release} {arch} {','.join(impls)} {'+'.join(checks)}"
                  f"{' ' + ' '.join(more[:2]) if more else ''}: exit {at['rc']} ({at['seconds']:.0f} s) {at['said'][:160]}",
                  flush=True)

    def beside(d: Path) -> tuple:
        """The option zoo's call: every option set the other releases' option tables (same checks) found too."""
        others = [str(o.resolve()) for o in sorted(d.parent.parent.glob(f"*/{d.name}")) if o != d and (o / "options.json").exists()]
        return ("--options",) + (("--sets-of", *others) if others else ())
    with ThreadPoolExecutor(max(1, a.workers)) as pool:
        if a.options:   # first every release's option table, then the doctor over all of their option sets
            n *= 2
            list(pool.map(lambda d: one_dir(d, ("--options", "--discover")), todo))
            list(pool.map(lambda d: one_dir(d, beside), todo))
        else:
            list(pool.map(one_dir, todo))
    if kept:
        print(f"backtest: {len(kept)} zoo call(s) skipped: their results are there and current", flush=True)
    return {"zoo_calls": len(done), "installs": len([v for v in fresh if v in ok])}


def main(argv=None) -> int:
    t0 = time.monotonic()
    a = parse(argv)
    try:
        entries = record.load()
    except record.RecordError as e:
        return fail(str(e))
    known = {e.id: e for e in entries}
    unknown = [i for i in a.ids or [] if i not in known]
    if unknown:
        return fail(f"no entry {', '.join(unknown)} in {record.RECORD} (its ids: {', '.join(known)})")
    if a.workers < 1 or a.cpu < 1:
        return fail("--workers and --cpu are at least 1")
    if not a.table:
        try:
            a.pinned.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            return fail(f"--pinned {a.pinned} cannot be made: {e.strerror or e}")
    registered = record.registered_checks()
    plans = [plan.plan(e, registered, nearest=not a.no_nearest, options=a.options) for e in entries]
    last = table.previous_run(a.out)
    if not a.table:
        chosen = [p for p in plans if not a.ids or p.entry.id in a.ids]
        try:
            last = run(chosen, a)
        except KeyboardInterrupt:   # the results written so far stay: the same command resumes
            print("backtest: interrupted; the same command resumes where it stopped", file=sys.stderr)
            return 130
        last.update(wall_s=round(time.monotonic() - t0, 1), cores=os.cpu_count())
    rows = []
    for p in plans:
        cs = outcomes.cells(p, a.out / "runs")
        v = outcomes.verdict(p, cs)
        rows.append(table.entry(p, cs, v))
        print(f"{p.entry.id:38} {v.kind:20} {v.text[:200]}")
    s = table.summary(rows, last)
    table.write(a.out, s)
    print(f"backtest: {table.recall_line(s)}; {a.out}/backtest.csv"
          + (f" ({last['wall_s'] / 60:.1f} min wall)" if not a.table else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
