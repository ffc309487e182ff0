"""The zoo: every causal-LM architecture of transformers, shrunk to random weights, examined by
the attention doctor with each attention implementation; one table per transformers release.

    python -m doctor_lab.zoo                                # all of MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    python -m doctor_lab.zoo --arch llama gpt2 --impl sdpa  # a few
    python -m doctor_lab.zoo --release 5.17.0 --pinned DIR  # another release, installed in DIR/tf-5.17.0
    python -m doctor_lab.zoo --transformers DIR             # the release installed in DIR (pip --target)
    python -m doctor_lab.zoo --checks none                  # build, forward and a cache step only
    python -m doctor_lab.zoo --arch phi3 --init sliding_window=16 --out DIR   # a condition the default lacks
    python -m doctor_lab.zoo --table                        # rewrite the tables from the results
    python -m doctor_lab.zoo --release 5.25.0 --pinned DIR --against 5.23.0   # and only what changed since 5.23.0
    python -m doctor_lab.zoo --options --arch qwen2 --release 4.48.0 --pinned DIR   # the option zoo (option_zoo.py)
    python -m doctor_lab.zoo --options --discover --arch llama gpt2           # only the option table

Writes <out>/runs/<arch>__<impl>.json (one per result, atomically; a rerun skips those done with
the same shrink, the same doctor and the same release), then reruns every fail and warn that is
not a known behaviour under the conditions of conditions.py (<out>/confirm/), then <out>/zoo.csv +
zoo.json, <out>/logs/ and <out>/cost.json (the run's wall and CPU time, all sessions). <out> is
results/zoo for the installed transformers, results/zoo/releases/<version> for another release;
results/zoo/releases.csv is then the table over releases. The option zoo (--options) writes
results/zoo_options/<version>/: options.csv and options.json (the option table: every config value
tried, found or not, by what, and the cost of finding them), then runs/, zoo.csv and zoo.json as the
zoo's, one row per architecture x option set x implementation x check.
"""
from doctor_lab.zoo import cost  # noqa: I001  first: the run's clock starts here

import argparse
import os
import sys
from pathlib import Path

# before transformers is imported anywhere: never reach for the hub
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# transformers >= 5.25 loads hub kernels by default (from_pretrained, hence config_roundtrip) and then
# requires the `kernels` package; offline they replace nothing, so the zoo loads without them
os.environ.setdefault("USE_HUB_KERNELS", "NO")

# flex_attention is not among the defaults (`--impl flex_attention` adds it): a third pass over every
# architecture. It runs eagerly, torch.compile off for the run (FLEX_EAGER): transformers compiles it,
# and the compiled kernel on CPU takes neither a backward nor the return_lse transformers asks for
# (every forward raises there), nor would a compile per input shape fit the zoo's time
IMPLS = ("eager", "sdpa")
FLEX, FLEX_EAGER = "flex_attention", ("TORCHDYNAMO_DISABLE", "1")
ROOT = Path("results/zoo")  # the installed release's table; other releases under ROOT/releases/
OPTIONS_ROOT = Path("results/zoo_options")  # the option zoo's tables, one dir per release


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m doctor_lab.zoo", description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", nargs="+", help="model types (default: all of --kind's mappings); commas work too")
    p.add_argument("--kind", default="causal_lm",
                   help="model kinds whose types the default run examines, comma-separated: causal_lm, seq2seq_lm, "
                        "image_text_to_text, vision_to_seq (doctor_lab/zoo/kinds.py); --arch takes a type of any")
    p.add_argument("--impl", default=",".join(IMPLS), help="attention implementations, comma-separated")
    p.add_argument("--transformers", type=Path, metavar="DIR",
                   help="a transformers release installed in DIR (pip install --no-deps --target DIR "
                        "transformers==X and the huggingface-hub/tokenizers it needs), used instead of the installed one")
    p.add_argument("--release", metavar="VERSION", help="the release in --pinned DIR/tf-VERSION")
    p.add_argument("--pinned", type=Path, metavar="DIR", help="where --release looks (DIR/tf-VERSION)")
    p.add_argument("--out", type=Path,
                   help=f"default: {ROOT} (installed transformers), {ROOT}/releases/VERSION (--release, --transformers)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=int, default=600, help="wall-clock seconds per architecture")
    p.add_argument("--cpu", type=int, default=300, help="CPU seconds per architecture (SIGXCPU past it)")
    p.add_argument("--mem-gb", type=float, default=4.0, help="address-space cap per architecture")
    p.add_argument("--checks", default="all", help="doctor checks, comma-separated; 'none': build and forward only")
    p.add_argument("--init", nargs="+", metavar="KEY=VALUE", default=[],
                   help="given to every architecture's shrunk config at construction, over its shrink entry "
                        "(e.g. sliding_window=16); results keyed apart")
    p.add_argument("--no-confirm", action="store_true", help="skip the reruns of new fails and warns under other conditions")
    p.add_argument("--redo", action="store_true", help="rerun results that exist")
    p.add_argument("--table", action="store_true", help="only rewrite zoo.csv, zoo.json (and the table over releases)")
    p.add_argument("--options", action="store_true",
                   help="the option zoo: find each architecture's attention options (doctor_lab/zoo/options.py), then "
                        "examine the default and every option set found (out: results/zoo_options/VERSION)")
    p.add_argument("--discover", action="store_true", help="with --options: only find the options (options.csv)")
    p.add_argument("--launcher", default="local", choices=("local", "submitit_local", "slurm"),
                   help="with --options: where its jobs run (one per architecture, then per architecture x option set): "
                        "forked workers here, a process per job through submitit, or a SLURM cluster")
    p.add_argument("--partition", help="with --launcher slurm: the partition")
    p.add_argument("--sets-of", nargs="+", default=[], metavar="VERSION",
                   help="with --options: also examine the option sets these releases' option tables found (rows that "
                        "compare like for like across releases: an option set one release has and another lacks)")
    p.add_argument("--against", metavar="OLD", help="then write what changed since release OLD's table (sentinel.py): "
                   "<out>/against-OLD.md")
    return p.parse_args(argv)


def fail(msg):
    print(f"zoo: {msg}", file=sys.stderr)
    sys.exit(2)


def use_release(a) -> str | None:
    """Put the release of --transformers / --release first on sys.path (before anything imports
    transformers) and check that it is the one imported; its version, or None for the installed one."""
    if a.release and a.transformers:
        fail("give --release (with --pinned) or --transformers, not both")
    if a.release:
        if not a.pinned:
            fail("--release VERSION needs --pinned DIR (the release is read from DIR/tf-VERSION)")
        a.transformers = a.pinned / f"tf-{a.release}"
    if not a.transformers:
        return None
    d = Path(os.path.abspath(a.transformers))  # not resolved: the package may be a tree of links
    if not (d / "transformers" / "__init__.py").is_file():
        fail(f"{a.transformers} holds no transformers package; install a release there with pip install --no-deps "
             f"--target {a.transformers} transformers==VERSION (and the huggingface-hub, tokenizers it needs)")
    if "transformers" in sys.modules:
        fail("transformers was imported before --transformers could take effect")
    sys.path.insert(0, str(d))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(d), *filter(None, [os.environ.get("PYTHONPATH")])])
    try:
        import transformers
    except Exception as e:  # noqa: BLE001  a release that needs another huggingface-hub or tokenizers: one line, exit 2
        fail(f"transformers from {a.transformers} does not import: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    if not Path(os.path.abspath(transformers.__file__)).is_relative_to(d):
        fail(f"transformers was imported from {transformers.__file__}, not from {a.transformers}")
    if a.release and transformers.__version__ != a.release:
        fail(f"{a.transformers} holds transformers {transformers.__version__}, not {a.release}")
    return transformers.__version__


def confirm(out: Path, archs: list[str], a, shrink: dict, run_key: str, session) -> None:
    """Rerun every fail and warn that the triage does not call a known behaviour (a new finding,
    a doctor false alarm, an untriaged row) under each condition; done ones are not redone."""
    import transformers

    from doctor_lab.report import triage
    from doctor_lab.zoo import runner, table
    from doctor_lab.zoo.confirm import confirm_path, run_confirm
    entries = triage.load()
    wanted: dict[str, dict[str, list[str]]] = {}
    for f in triage.flags([r for r in table.load(out) if r["arch"] in set(archs)], transformers.__version__):
        e = triage.assign(f, entries)
        if e is None or e["kind"] != "known":
            wanted.setdefault(f["arch"], {}).setdefault(f["impl"], []).append(f["check"])
    if not wanted:
        return
    keys = {x: f"{run_key}:" + ";".join(f"{i}={','.join(c)}" for i, c in sorted(w.items())) for x, w in wanted.items()}
    tasks = {x: [i for i in w if a.redo or not runner.done(out, x, i, keys[x], confirm_path)] for x, w in wanted.items()}
    tasks = {x: i for x, i in tasks.items() if i}
    if not tasks:
        return
    print(f"zoo: {sum(map(len, tasks.values()))} fail/warn row set(s) to rerun under other conditions "
          f"({', '.join(sorted(tasks))})", flush=True)

    def progress(line):
        print(line, flush=True)
        session.record("confirmed")
    runner.run(tasks, out, checks=wanted, table=shrink, hashes=keys, workers=a.workers, timeout_s=a.timeout,
               cpu_s=a.cpu, mem_bytes=int(a.mem_gb * 2 ** 30), body=run_confirm, path=confirm_path, progress=progress)


def main(argv=None):
    a = parse(argv)
    if FLEX in a.impl.split(","):   # read when torch._dynamo is first imported: before any torch import here
        os.environ.setdefault(*FLEX_EAGER)
    version = use_release(a)
    from attention_doctor.hf import TargetError
    from attention_doctor.hf import transformers as need_transformers
    try:
        transformers = need_transformers()
    except TargetError as e:   # not installed: one line naming the install command, exit 2
        fail(str(e))

    from doctor_lab.zoo import kinds, runner, table
    from doctor_lab.zoo.shrink import entry_hash, load_table, parse_values, with_init
    if (a.discover or a.launcher != "local" or a.sets_of) and not a.options:
        fail("--discover, --launcher and --sets-of go with --options")
    out = a.out or (OPTIONS_ROOT / transformers.__version__ if a.options else ROOT / "releases" / version if version else ROOT)
    wanted_kinds = [k for k in a.kind.split(",") if k]
    if not wanted_kinds or any(k not in kinds.KINDS for k in wanted_kinds):
        fail(f"--kind {a.kind!r}: give some of {','.join(kinds.KINDS)}")
    every = kinds.every(wanted_kinds)
    archs = [x for s in a.arch for x in s.split(",") if x] if a.arch else every
    unknown = [x for x in archs if kinds.of(x) is None]
    if unknown:
        fail(f"not a model type of transformers {transformers.__version__}'s causal-LM, seq2seq-LM or image-text "
             f"mappings: {', '.join(unknown)}")
    if a.init and not a.out:
        fail("--init needs --out: the release's own table holds the shrink table's configs only")
    impls = [i for i in a.impl.split(",") if i]
    if not impls or any(not i.replace("_", "").isalnum() for i in impls):
        fail(f"--impl {a.impl!r}: give names like eager,sdpa")
    checks = None if a.checks == "all" else [] if a.checks == "none" else a.checks.split(",")
    if checks:
        from attention_doctor.checks import ORDER
        bad = [c for c in checks if c not in ORDER]
        if bad:
            fail(f"unknown check(s) {', '.join(bad)}; known: {', '.join(ORDER)}")
    try:
        shrink = with_init(load_table(), archs, parse_values(a.init))
    except (OSError, ValueError) as e:
        fail(str(e))
    if wanted_kinds != list(kinds.DEFAULT):   # a type built as another kind than its first: keyed apart (entry_hash)
        shrink = {**shrink, "archs": dict(shrink["archs"])}
        for x in archs:
            k = kinds.of(x, wanted_kinds)[0]
            if k != kinds.of(x)[0]:
                shrink["archs"][x] = {**(shrink["archs"].get(x) or {"why": "built as another kind"}), "kind": k}
    # one table, one doctor, one release: a result of another is stale
    run_key = f"{runner.doctor_hash()}-tf{transformers.__version__}" + ("" if checks is None else "-" + ",".join(checks or ["none"]))
    hashes = {x: f"{entry_hash(x, shrink)}-{run_key}" for x in archs}
    if a.options:
        return option_zoo(a, out, archs, impls, checks, shrink, run_key)
    tasks = runner.pending(archs, impls, out, hashes, a.redo)
    session = cost.Session(out, run_key, a.workers, reset=a.redo and not a.arch)
    if not a.table and tasks:
        print(f"zoo: transformers {transformers.__version__}: {len(tasks)} architecture(s) to run, "
              f"{len(archs) - len(tasks)} already done; {a.workers} worker(s), logs in {out}/logs", flush=True)

        def progress(line):
            print(line, flush=True)
            session.record("archs_run")
        runner.run(tasks, out, checks=checks, table=shrink, hashes=hashes, workers=a.workers,
                   timeout_s=a.timeout, cpu_s=a.cpu, mem_bytes=int(a.mem_gb * 2 ** 30), progress=progress)
    if not a.table and checks is None and not a.no_confirm:
        confirm(out, archs, a, shrink, run_key, session)
    ran = [r["arch"] for r in table.load(out) if r["arch"] not in every and kinds.of(r["arch"])]
    s = table.write(out, list(dict.fromkeys(every + archs + ran)), run_key)   # types of other kinds run here: tabled too
    over = table.write_releases(out)
    c = s.get("cost") or {}
    print(f"zoo: transformers {s.get('transformers', transformers.__version__)}: {s['examined']} of {s['archs']} "
          f"architectures examined; {out}/zoo.csv" + (f" ({c['wall_s']:.0f} s wall, {c['cpu_s']:.0f} s CPU in all)" if c else "")
          + (f"; the table over releases: {over}" if over else ""))
    if a.against:
        from doctor_lab.zoo import sentinel
        try:
            path, d = sentinel.write(out, ROOT, a.against)
        except ValueError as e:
            fail(str(e))
        print(f"zoo: against {a.against}: {len(d.new_fails)} new fail or warn rows, {len(d.new_blind)} new inconclusive, "
              f"{len(d.fixed)} fixed; problems new {len(d.problems_new)}, gone {len(d.problems_gone)}: {path}")
    return 0


def option_zoo(a, out: Path, archs: list[str], impls: list[str], checks, shrink: dict, run_key: str) -> int:
    """Find the options of `archs` (one capped process each; resumable), write the option table and
    print what finding them cost per architecture; then (unless --discover) the doctor on each
    architecture x option set, one job each, and the table."""
    import transformers

    from doctor_lab.zoo import launch, runner, table
    from doctor_lab.zoo import option_zoo as oz
    from doctor_lab.zoo.shrink import entry_hash
    caps = {"workers": a.workers, "timeout_s": a.timeout, "cpu_s": a.cpu, "mem_bytes": int(a.mem_gb * 2 ** 30),
            "launcher": a.launcher, "partition": a.partition}
    # the options are found under every implementation the zoo knows, whichever the doctor examines: an
    # option one path ignores (the bug itself) changes the other's code
    measured = list(dict.fromkeys([*IMPLS, *impls]))
    found_key = {x: f"{entry_hash(x, shrink)}-options{oz.code_hash()}-tf{transformers.__version__}-{','.join(measured)}"
                 for x in archs}
    try:   # a release's version (its option zoo beside this one) or a directory holding an option table
        also = oz.sets_of([Path(v) if os.sep in v else out.parent / v for v in a.sets_of], archs)
    except ValueError as e:
        fail(str(e))
    todo = runner.pending(archs, [oz.DISCOVER], out, found_key, a.redo, path=oz.discovery_path)
    if todo and not a.table:
        print(f"zoo: transformers {transformers.__version__}: finding the options of {len(todo)} architecture(s)", flush=True)
        launch.run(todo, out, checks=measured, table=shrink, hashes=found_key, path=oz.discovery_path,
                   body=oz.discover_job, **caps)
    found = oz.load(out, archs)
    oz.write_table(out, found)
    for x, d in sorted(found.items()):
        c = d.get("cost", {})
        print(f"zoo: options of {x}: {sum(t['found'] for t in d.get('tried', []))} found of {len(d.get('tried', []))} "
              f"tried ({d.get('status')}{': ' + d['reason'] if d.get('reason') else ''}); "
              f"{c.get('wall_s', '?')} s wall, {c.get('cpu_s', '?')} s CPU", flush=True)
    print(f"zoo: the option table: {out}/options.csv", flush=True)
    if a.discover:
        return 0
    sets = oz.jobs(found, also)
    hashes = {k: f"{entry_hash(arch, shrink)}-{run_key}" for k, (arch, _) in sets.items()}
    tasks = runner.pending(list(sets), impls, out, hashes, a.redo)
    session = cost.Session(out, run_key, a.workers, reset=a.redo and not a.arch)
    if tasks and not a.table:
        print(f"zoo: {len(tasks)} architecture x option set job(s) to run, {len(sets) - len(tasks)} already done", flush=True)

        def progress(line):
            print(line, flush=True)
            session.record("archs_run")
        oz.run_jobs(sets, tasks, out, checks=checks, table=shrink, hashes=hashes, progress=progress, **caps)
    table.write(out, archs, run_key)
    print(f"zoo: transformers {transformers.__version__}: {len(sets)} architecture x option sets; {out}/zoo.csv")
    if a.against:
        from doctor_lab.zoo import sentinel
        try:
            path, d = sentinel.write(out, OPTIONS_ROOT, a.against, " --options --arch " + " ".join(archs))
        except ValueError as e:
            fail(str(e))
        new, gone = oz.options_delta(OPTIONS_ROOT / a.against, out)
        with open(path, "a") as f:
            f.write(oz.render_delta(new, gone, a.against, transformers.__version__))
        print(f"zoo: against {a.against}: {len(d.new_fails)} new fail or warn rows, {len(d.fixed)} fixed; options found "
              f"new {sum(map(len, new.values()))}, gone {sum(map(len, gone.values()))}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
