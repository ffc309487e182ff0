"""Where a zoo's jobs run: `local` forks capped workers on this machine (runner.run); `submitit_local`
(a process per job on this machine) and `slurm` (a job per task on a SLURM cluster) go through
submitit, the launcher the suite's sweeps use. A job is one runner task (an architecture, or an
architecture x option set, with its implementations) and writes the same result files, so the
tables come out the same either way; at most `workers` jobs are out at once, a finished result is
never redone (resumable), and a job that dies, times out or is cancelled leaves a row saying so."""
import time
from pathlib import Path

from doctor_lab.zoo import runner
from doctor_lab.zoo.worker import result_path
from experiments.io import write_json

LAUNCHERS = ("local", "submitit_local", "slurm")
POLL_S = 0.5


def run(tasks: dict[str, list[str]], out: Path, *, launcher: str = "local", partition: str | None = None,
        checks, table: dict, hashes: dict[str, str], workers: int = 2, timeout_s: int = 600, cpu_s: int = 300,
        mem_bytes: int = 4 << 30, progress=print, body=None, path=result_path, **kw) -> None:
    """runner.run's contract (tasks: key -> impls; body(key, impls, out, checks, table, hash, mem, cpu)
    writes path(out, key, impl) for each impl), on the launcher named."""
    if launcher == "local":
        runner.run(tasks, out, checks=checks, table=table, hashes=hashes, workers=workers, timeout_s=timeout_s,
                   cpu_s=cpu_s, mem_bytes=mem_bytes, progress=progress, path=path,
                   **({"body": body} if body else {}), **kw)
        return
    import submitit
    ex = submitit.AutoExecutor(folder=Path(out) / "submitit", cluster="local" if launcher == "submitit_local" else "slurm")
    ex.update_parameters(timeout_min=timeout_s // 60 + 2, cpus_per_task=1,
                         **({"slurm_partition": partition} if partition and launcher == "slurm" else {}))
    queue, out_now, n, finished = list(tasks.items()), {}, len(tasks), 0
    while queue or out_now:
        while queue and len(out_now) < max(1, workers):
            key, impls = queue.pop(0)
            mem = (table["archs"].get(key) or {}).get("mem_gb")
            job = ex.submit(body or runner.run_arch, key, impls, str(out),
                            checks[key] if isinstance(checks, dict) else checks, table, hashes[key],
                            int(mem * 2 ** 30) if mem else mem_bytes, cpu_s)
            out_now[key] = (job, impls, time.monotonic())
        time.sleep(POLL_S)
        for key, (job, impls, started) in list(out_now.items()):
            late = time.monotonic() - started > timeout_s
            if not job.done() and not late:
                continue
            if late and not job.done():
                job.cancel(check=False)
            why = _why(job, late, timeout_s)
            for impl in [i for i in impls if not runner.done(out, key, i, hashes[key], path)]:
                write_json(path(out, key, impl), {"arch": key, "impl": impl, "status": runner.TIMEOUT if late else runner.CRASH,
                                                  "reason": why, "shrink_hash": hashes[key],
                                                  "wall_s": round(time.monotonic() - started, 1), "job": job.job_id})
            del out_now[key]
            finished += 1
            progress(f"[{finished}/{n}] {key}: job {job.job_id} {launcher} ({time.monotonic() - started:.0f} s)"
                     + (f": {why}" if why else ""))


def _why(job, late: bool, timeout_s: int) -> str:
    """'' for a job that returned; else why not, in one line."""
    if late:
        return f"cancelled after {timeout_s} s wall clock"
    try:
        job.result()
    except Exception as e:  # noqa: BLE001  a job that raised or died (submitit's FailedJobError): its row says so
        return " ".join(f"{type(e).__name__}: {e}".split())[:300]
    return ""
