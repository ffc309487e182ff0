"""train.threads=auto: torch's CPU threads from the cores that are free when the run starts.

One thread per free core: all cores on a quiet machine, one when other processes keep the cores
busy (OpenMP threads that share a core with another busy process spin and wait on each other:
`python -m experiments.bench threads` measures both cases). Free = usable cores - other runnable
processes, read from the kernel's count of runnable threads (/proc/stat procs_running, sampled for
a tenth of a second, this process left out), else the 1-minute load average. OMP_NUM_THREADS, set
by a user or a launcher (the reference sets 1 per job), wins over the reading; train.threads=N wins
over both. The reading and the choice go to summary.json (env.threads, env.threads_why).
"""
import os
import statistics
import time
from pathlib import Path

SAMPLES, INTERVAL_S = 10, 0.01


def usable_cores() -> int:
    """Cores this process may run on (its affinity: a container or taskset may allow fewer)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def runnable_now(stat: Path = Path("/proc/stat"), samples: int = SAMPLES, interval_s: float = INTERVAL_S) -> float | None:
    """Runnable threads on the machine besides this one (the median of `samples` readings of
    procs_running); None where the kernel does not say (not Linux)."""
    counts = []
    for i in range(samples):
        try:
            line = next(l for l in stat.read_text().splitlines() if l.startswith("procs_running "))
        except (OSError, StopIteration):
            return None
        counts.append(int(line.split()[1]) - 1)  # this process, reading, is one of them
        if i + 1 < samples:
            time.sleep(interval_s)
    return max(0.0, statistics.median(counts))


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows; or no load average to read
        return None


def omp_threads(omp: str | None) -> int | None:
    """OMP_NUM_THREADS as a thread count, or None where it is unset or not a count >= 1."""
    return int(omp) if omp and omp.strip().isdigit() and int(omp) >= 1 else None


def choose(setting, omp: str | None, cores: int, busy: float | None) -> tuple[int | None, str]:
    """(threads, why) for train.threads `setting` (an int, None: torch's own, or "auto"), with
    OMP_NUM_THREADS `omp`, `cores` usable cores and `busy` other runnable processes (None: unknown).
    An unreadable machine gets one thread: oversubscribing costs far more than one idle core."""
    if setting != "auto":
        return setting, "train.threads" if setting is not None else "torch's default"
    if (n := omp_threads(omp)) is not None:
        return n, f"OMP_NUM_THREADS={n}"
    if busy is None:
        return 1, "auto: the machine's load is unknown"
    free = max(1, cores - round(busy))
    return free, f"auto: {busy:g} other runnable of {cores} cores"


def auto_threads(setting) -> tuple[int | None, str]:
    """choose() with this machine's readings (procs_running, else the load average)."""
    omp = os.environ.get("OMP_NUM_THREADS")
    read = setting == "auto" and omp_threads(omp) is None  # OMP_NUM_THREADS wins: nothing to read (0.1 s)
    busy = runnable_now() if read else None
    if read and busy is None:
        busy = load_average()
    return choose(setting, omp, usable_cores(), busy)
