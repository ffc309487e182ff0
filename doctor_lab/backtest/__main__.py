"""The backtest, one command: for each regression of record.yaml, the doctor on its architectures x
implementations on the release before it, the one that introduced it and the one that fixed it, each
release installed in isolation; then the table and the recall.

    python -m doctor_lab.backtest --pinned DIR            # every entry; releases installed in DIR/tf-VERSION
    python -m doctor_lab.backtest --ids gpt_sdpa_cache_no_mask --pinned DIR
    python -m doctor_lab.backtest --table                 # only rewrite the table from the runs there are
    python -m doctor_lab.backtest --options --pinned DIR  # each entry's architectures over every option set the
                                                          # option zoo finds (doctor_lab/zoo/options.py), config: unused

An entry of another library (record.yaml's library:) runs through that library's zoo (plan.ZOOS: its
targets are the entry's architectures, its paths the implementations, plan.PATHS), with the release's
directory first on the path. The table judges an entry by the option zoo's rows where a --options run
made them for its introducing release, else by its config's (judged()).

Runs go to <out>/runs/<release>/<checks>/ (the zoo's layout; kept: a killed backtest resumes), the
table to <out>/backtest.csv, backtest.json and backtest.md (the whole record, whichever --ids ran).
Exit code 0; 2 on bad input (an unknown id, a record that does not load, a --pinned that cannot be made);
130 when interrupted (rerun the same command: what finished is kept)."""
import argparse
import dataclasses
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from doctor_lab.backtest import outcomes, plan, record, releases, runner, table
from doctor_lab.zoo.shrink import load_table

OUT = Path("results/backtest")


@dataclass(frozen=True)
class Call:
    """One zoo call: an architecture (another library's target) on a release, on some implementations."""
    library: str
    release: str
    arch: str
    impls: tuple
    checks: tuple
    config: tuple


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


def calls(plans: list[plan.Plan], runs: Path) -> dict[Path, list[Call]]:
    """run dir -> its zoo calls, one per architecture, impls merged."""
    out: dict[Path, dict[str, Call]] = {}
    for p in plans:
        if not p.checks:
            continue
        for release in p.releases.values():
            d = p.run_dir(runs, release)
            for arch in p.entry.architectures:
                have = out.setdefault(d, {}).get(arch, Call(p.entry.library, release, arch, (), p.checks, p.config))
                out[d][arch] = dataclasses.replace(have, impls=have.impls + tuple(i for i in p.impls if i not in have.impls))
    return {d: list(by.values()) for d, by in out.items()}


def run(plans: list[plan.Plan], a) -> dict:
    """Install every release the plans need, then the zoo calls, `workers` run dirs at a time."""
    todo = calls(plans, a.out / "runs")
    wanted = list(dict.fromkeys((c.library, c.release) for cs in todo.values() for c in cs))
    fresh = [w for w in wanted if not releases.installed(a.pinned, w[1], w[0])]
    ok = {w for w in wanted if runner.install(w[1], a.pinned, a.out / "runs", library=w[0],
                                              log=lambda m: print(f"  {m}", flush=True))}
    for lib, v in sorted(set(wanted) - ok):
        print(f"backtest: {lib} {v} not installed: "
              f"{runner.read_install_error(a.out / 'runs', plan.release_dir(v, lib))}", flush=True)
    n = sum(len(cs) for d, cs in todo.items() if (cs[0].library, cs[0].release) in ok)
    done, kept = [], []
    shrink = load_table()

    def one_dir(d: Path, extra=()):
        for c in todo[d]:
            if (c.library, c.release) not in ok:
                continue
            if c.library == releases.TRANSFORMERS and not a.options and \
                    runner.current(d, c.release, c.arch, c.impls, c.checks, shrink, c.config):
                kept.append(c.arch)   # (the other zoos skip their done targets themselves, at the cost of an import)
                continue
            more = () if c.library != releases.TRANSFORMERS else extra(d) if callable(extra) else extra
            at = runner.run_arch(c.release, a.pinned, d, c.arch, c.impls, c.checks, a.cpu, c.config, more, c.library)
            done.append(at)
            print(f"[{len(done) + len(kept)}/{n}] {c.library} {c.release} {c.arch} {','.join(c.impls)} {'+'.join(c.checks)}"
                  f"{' ' + ' '.join(more[:2]) if more else ''}: exit {at['rc']} ({at['seconds']:.0f} s) {at['said'][:160]}",
                  flush=True)

    def beside(d: Path) -> tuple:
        """The option zoo's call: every option set the other releases' option tables (same checks) found too."""
        others = [str(o.resolve()) for o in sorted(d.parent.parent.glob(f"*/{d.name}")) if o != d and (o / "options.json").exists()]
        return ("--options",) + (("--sets-of", *others) if others else ())
    with ThreadPoolExecutor(max(1, a.workers)) as pool:
        if a.options:   # first every release's option table, then the doctor over all of their option sets
            opt = [d for d in todo if d.name.endswith(plan.OPTIONS)]   # another library's dirs run once, below
            n += sum(len(todo[d]) for d in opt)
            list(pool.map(lambda d: one_dir(d, ("--options", "--discover")), opt))
            list(pool.map(lambda d: one_dir(d, beside), todo))
        else:
            list(pool.map(one_dir, todo))
    if kept:
        print(f"backtest: {len(kept)} zoo call(s) skipped: their results are there and current", flush=True)
    return {"zoo_calls": len(done), "installs": len([w for w in fresh if w in ok])}


def judged(e: record.Regression, registered: frozenset[str], a) -> plan.Plan:
    """The plan an entry is judged by: the option zoo's rows where a --options run made them for it (every
    one of its releases has a row of each of its architectures: option run dirs are shared by the entries
    with the same checks, so another entry's run is not this one's), its hand-written config unused; else
    its config's. So a --options run of some entries (--ids) and a plain run of the rest make one table,
    each entry saying which it was."""
    p = plan.plan(e, registered, nearest=not a.no_nearest, options=True)
    if p.options and p.checks and outcomes.covered(p, a.out / "runs"):
        return p
    return plan.plan(e, registered, nearest=not a.no_nearest, options=False)


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
    last = table.previous_run(a.out)
    if not a.table:
        chosen = [plan.plan(e, registered, nearest=not a.no_nearest, options=a.options)
                  for e in entries if not a.ids or e.id in a.ids]
        try:
            last = run(chosen, a)
        except KeyboardInterrupt:   # the results written so far stay: the same command resumes
            print("backtest: interrupted; the same command resumes where it stopped", file=sys.stderr)
            return 130
        last.update(wall_s=round(time.monotonic() - t0, 1), cores=os.cpu_count())
    rows = []
    for p in (judged(e, registered, a) for e in entries):
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
