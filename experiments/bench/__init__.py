"""Benchmarks: every figure is printed by a run, ratios are measured side by side in one process.

    python -m experiments.bench shakespeare   # nanoGPT's CPU config on tiny Shakespeare: val loss, tokens/s
    python -m experiments.bench throughput    # our loop vs a bare loop, diagnostics off / default interval
    python -m experiments.bench cost          # FLOPs of projections vs attention, counted and timed
    python -m experiments.bench memory        # bytes saved for backward: explicit weights vs SDPA
    python -m experiments.bench threads       # `python run.py` at 1, 2 and auto (the default) torch threads, idle and beside busy processes
Each takes --tiny (a seconds-long smoke size, used by the tests). training.py holds the first two,
attention_cost.py the next two, threads.py the last, nanogpt_reference.py nanoGPT's loop transcribed.
"""
import argparse
import datetime
import sys
from pathlib import Path

import torch

from experiments.bench.attention_cost import GiB, MiB, bench_cost, bench_memory, saved_bytes  # noqa: F401
from experiments.bench.threads import bench_threads
from experiments.bench.training import NANOGPT, TINY_MODEL, bench_shakespeare, bench_throughput, compose  # noqa: F401
from experiments.io import write_json

BENCHES = {"shakespeare": bench_shakespeare, "throughput": bench_throughput,
           "cost": bench_cost, "memory": bench_memory, "threads": bench_threads}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m experiments.bench", description=__doc__.splitlines()[0])
    p.add_argument("name", choices=sorted(BENCHES))
    p.add_argument("--tiny", action="store_true", help="a seconds-long smoke size")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: a run's, train.threads=auto: the cores free at the start)")
    p.add_argument("--out", type=Path, default=None,
                   help="also write the figures as JSON (results/bench/NAME.json feeds the report)")
    p.add_argument("--reference", action="store_true",
                   help="shakespeare: also train nanoGPT's own loop (transcribed) from the same seed")
    p.add_argument("overrides", nargs="*", help="Hydra overrides (shakespeare, throughput, threads), e.g. device=cuda")
    a = p.parse_intermixed_args(argv)
    if a.threads:  # shakespeare sets its threads as a run does, from train.threads
        torch.set_num_threads(a.threads)
        a.overrides = [*a.overrides, f"train.threads={a.threads}"] if a.name == "shakespeare" else a.overrides
    kwargs = {"tiny": a.tiny}
    if a.overrides:
        if a.name not in ("shakespeare", "throughput", "threads"):
            p.error(f"{a.name} takes no config overrides")
        kwargs["overrides"] = a.overrides
    if a.reference:
        if a.name != "shakespeare":
            p.error("--reference is for shakespeare")
        kwargs["reference"] = True
    try:
        out = BENCHES[a.name](**kwargs)
        if a.out:
            write_json(a.out, {"bench": a.name, "date": datetime.date.today().isoformat(),
                               "threads": torch.get_num_threads(),
                               "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None, **out})
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
