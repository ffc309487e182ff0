"""How many torch threads a run should use (conf/train/cpu.yaml's train.threads): the README's
first command, `python run.py`, timed whole (start-up, training, its control-free verdict and
figure) at 1 and 2 threads and at the default (auto: the cores free at its start,
experiments/training/threads.py), interleaved round by round, on the machine as it is and beside
busy processes (`python -c "while True: pass"`, as a newcomer's other jobs). Each run's 1-minute
load average is recorded before it starts, and what auto chose (summary.json's env): on a shared
machine the other users' load is part of the wall time; the CPU seconds the run used (its process
and children) are less sensitive to it, and show what oversubscribed threads burn spinning. The
figure that matters: the default's time over the best fixed setting's, per case (target <= 1.1)."""
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments.config import CONF, compose

RUN_PY = CONF.parent / "run.py"
BUSY = "while True: pass"
# the tests' size: a few steps (beside the other tests, each step at 2 threads spins through its wait)
TINY = ["train.steps=4", "train.eval_batches=1", "train.diag_every=0", "logger=none"]


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def time_run(threads, overrides=()) -> tuple[float, float, int | None]:
    """(wall seconds, CPU seconds, the threads it ran with) of `python run.py train.threads=N
    OVERRIDES` in a fresh dir, W&B offline as the defaults have it; no OMP_NUM_THREADS (auto reads
    the machine)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    with tempfile.TemporaryDirectory() as d:
        t0, c0 = time.perf_counter(), children_cpu()
        p = subprocess.run([sys.executable, str(RUN_PY), f"train.threads={threads}", f"results_dir={d}/results",
                            *overrides], cwd=d, env=env, capture_output=True, text=True, timeout=1800)
        wall, cpu = time.perf_counter() - t0, children_cpu() - c0
        ran = [json.loads(f.read_text()).get("env", {}).get("threads") for f in Path(d).rglob("summary.json")]
    if p.returncode != 0:
        raise RuntimeError(f"python run.py train.threads={threads} exited {p.returncode}: {p.stderr[-500:]}")
    return wall, cpu, (ran or [None])[0]


def bench_threads(tiny=False, busy=(0, 2), threads=(1, 2, "auto"), rounds=1, overrides=()) -> dict:
    """Median wall time of the default run per (busy processes beside it, threads) over `rounds`
    (one by default: on a shared 2-core machine a run at 2 threads beside other work takes many
    minutes, and the gap between 1 and 2 threads is many times the spread); tiny (the tests): 4
    steps at 1 thread and at the default, nothing beside them (a busy process would spin through as
    much CPU as the two runs)."""
    over = [*(TINY if tiny else []), *overrides]
    busy = (0,) if tiny else busy
    threads = (1, "auto") if tiny else threads   # the tests: one fixed setting beside the default
    rows = []
    for b in busy:
        spinners = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(b)]
        try:
            time.sleep(1 if b else 0)  # the spinners running before the clock starts
            for r in range(rounds):
                for t in threads:
                    load = os.getloadavg()[0]
                    wall, cpu, ran = time_run(t, over)
                    rows.append({"busy": b, "threads": t, "ran": ran, "round": r, "wall_s": round(wall, 2),
                                 "cpu_s": round(cpu, 2), "load_before": round(load, 2)})
                    print(f"threads: {b} busy, train.threads={t} (ran {ran}), round {r}: {wall:.1f} s wall, "
                          f"{cpu:.1f} s CPU (load average before: {load:.2f})", flush=True)
        finally:
            for s in spinners:
                s.kill()
                s.wait()
    median = {f"{b} busy, {t} threads": statistics.median(x["wall_s"] for x in rows
                                                           if x["busy"] == b and x["threads"] == t)
              for b in busy for t in threads}
    median_cpu = {f"{b} busy, {t} threads": statistics.median(x["cpu_s"] for x in rows
                                                               if x["busy"] == b and x["threads"] == t)
                  for b in busy for t in threads}
    for k, v in median.items():
        print(f"threads: median {k}: {v:.1f} s wall, {median_cpu[k]:.1f} s CPU", flush=True)
    default = compose([])["train"]["threads"]
    print(f"threads: default train.threads = {default} (conf/train/cpu.yaml)", flush=True)
    vs_best = default_vs_best(median, busy, threads, default)
    for b, ratio in vs_best.items():
        print(f"threads: {b} busy: the default's wall time / the best fixed setting's = {ratio:.2f} (target <= 1.1)",
              flush=True)
    return {"command": "python run.py" + "".join(f" {o}" for o in over), "cores": os.cpu_count(),
            "default_threads": default, "rounds": rounds, "rows": rows, "median_s": median, "median_cpu_s": median_cpu,
            "default_vs_best": vs_best, "tiny": tiny}


def default_vs_best(median: dict, busy, threads, default) -> dict:
    """{busy: the default setting's median wall time / the fastest fixed setting's}, where both were run."""
    fixed = [t for t in threads if isinstance(t, int)]
    if default not in threads or not fixed:
        return {}
    return {b: median[f"{b} busy, {default} threads"] / min(median[f"{b} busy, {t} threads"] for t in fixed)
            for b in busy}
