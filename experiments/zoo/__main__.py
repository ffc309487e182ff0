"""The zoo: every causal-LM architecture of transformers, shrunk to random weights, examined by
the attention doctor with each attention implementation; one table.

    python -m experiments.zoo                                # all of MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    python -m experiments.zoo --arch llama gpt2 --impl sdpa  # a few
    python -m experiments.zoo --checks none                  # build, forward and a cache step only
    python -m experiments.zoo --table                        # rewrite zoo.csv/zoo.json from the results

Writes <out>/runs/<arch>__<impl>.json (one per result, atomically; a rerun skips those done
with the same shrink and the same doctor), <out>/logs/<arch>.log, and <out>/zoo.csv + zoo.json.
"""
import argparse
import os
import sys
import time
from pathlib import Path

# before transformers is imported anywhere: never reach for the hub
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# flex_attention also runs on CPU, but torch.compile builds it anew for every input shape (seconds
# of CPU each, and the doctor uses dozens of shapes): `--impl flex_attention` for a few architectures
IMPLS = ("eager", "sdpa")


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m experiments.zoo", description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", nargs="+", help="model types (default: all of the mapping); commas work too")
    p.add_argument("--impl", default=",".join(IMPLS), help="attention implementations, comma-separated")
    p.add_argument("--out", default="results/zoo", type=Path)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=int, default=600, help="wall-clock seconds per architecture")
    p.add_argument("--cpu", type=int, default=300, help="CPU seconds per architecture (SIGXCPU past it)")
    p.add_argument("--mem-gb", type=float, default=4.0, help="address-space cap per architecture")
    p.add_argument("--checks", default="all", help="doctor checks, comma-separated; 'none': build and forward only")
    p.add_argument("--redo", action="store_true", help="rerun results that exist")
    p.add_argument("--table", action="store_true", help="only rewrite zoo.csv and zoo.json")
    return p.parse_args(argv)


def fail(msg):
    print(f"zoo: {msg}", file=sys.stderr)
    sys.exit(2)


def main(argv=None):
    a = parse(argv)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from experiments.zoo import runner, table
    from experiments.zoo.shrink import entry_hash, load_table
    every = list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    archs = [x for s in a.arch for x in s.split(",") if x] if a.arch else every
    unknown = [x for x in archs if x not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES]
    if unknown:
        fail(f"not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES: {', '.join(unknown)}")
    impls = [i for i in a.impl.split(",") if i]
    if not impls or any(not i.replace("_", "").isalnum() for i in impls):
        fail(f"--impl {a.impl!r}: give names like eager,sdpa")
    checks = None if a.checks == "all" else [] if a.checks == "none" else a.checks.split(",")
    if checks:
        from attention_doctor.catalogue import ORDER
        bad = [c for c in checks if c not in ORDER]
        if bad:
            fail(f"unknown check(s) {', '.join(bad)}; known: {', '.join(ORDER)}")
    try:
        shrink = load_table()
    except (OSError, ValueError) as e:
        fail(str(e))
    doctor = runner.doctor_hash()
    hashes = {x: f"{entry_hash(x, shrink)}-{doctor}" + ("" if checks is None else "-" + ",".join(checks or ["none"]))
              for x in archs}
    tasks = runner.pending(archs, impls, a.out, hashes, a.redo)
    t0 = time.monotonic()
    if not a.table and tasks:
        print(f"zoo: {len(tasks)} architecture(s) to run, {len(archs) - len(tasks)} already done; "
              f"{a.workers} worker(s), logs in {a.out}/logs", flush=True)
        runner.run(tasks, a.out, checks=checks, table=shrink, hashes=hashes, workers=a.workers,
                   timeout_s=a.timeout, cpu_s=a.cpu, mem_bytes=int(a.mem_gb * 2 ** 30))
    s = table.write(a.out, every)
    print(f"zoo: {s['examined']} of {s['archs']} architectures examined; {a.out}/zoo.csv "
          f"({time.monotonic() - t0:.0f} s wall)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
