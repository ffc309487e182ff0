"""Run architectures side by side, each in a process of its own, forked from this one after
torch and transformers are imported (the import is paid once, not per architecture). A process
that outlives its wall-clock limit is killed; one that dies (a signal, the memory cap, SIGXCPU)
leaves no result file, and its missing rows are written here saying so. Finished results are
not redone: a killed run resumes where it stopped."""
import ctypes
import json
import multiprocessing as mp
import signal
import time
from pathlib import Path

from doctor_lab.zoo.worker import MEMORY, result_path, run_arch
from experiments.io import write_json

TIMEOUT, CRASH = "timeout", "crash"
PR_SET_PDEATHSIG = 1


def done(out: Path, arch: str, impl: str, table_hash: str, path=result_path) -> bool:
    """A result exists for this shrink (a changed shrink-table entry makes it stale)."""
    p = path(out, arch, impl)
    if not p.exists():
        return False
    try:
        r = json.loads(p.read_text())
    except (OSError, ValueError):
        return False
    return r.get("shrink_hash") == table_hash


def pending(archs, impls, out: Path, hashes: dict[str, str], redo=False, path=result_path) -> dict[str, list[str]]:
    """arch -> the implementations without a current result (all of them with redo)."""
    tasks = {a: [i for i in impls if redo or not done(out, a, i, hashes[a], path)] for a in archs}
    return {a: i for a, i in tasks.items() if i}


def _child(body, *args):
    try:  # die with the runner: a killed zoo leaves no orphan workers behind
        ctypes.CDLL("libc.so.6").prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    body(*args)


def _log_tail(out: Path, arch: str) -> str:
    p = Path(out) / "logs" / f"{arch}.log"
    try:
        lines = [ln.strip() for ln in p.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def _died(proc, killed_at, limits) -> tuple[str, str]:
    """(status, reason) of a process that ended without writing all of its rows."""
    code = proc.exitcode
    if killed_at is not None:
        return TIMEOUT, f"killed after {limits['timeout_s']} s wall clock"
    if code is not None and code < 0:
        sig = signal.Signals(-code).name
        if sig == "SIGXCPU":
            return TIMEOUT, f"{limits['cpu_s']} CPU seconds exceeded (SIGXCPU)"
        if sig == "SIGKILL":  # not ours: the kernel's OOM killer
            return MEMORY, "killed by SIGKILL (out of memory)"
        return CRASH, f"died of {sig}"
    return CRASH, f"exited with code {code}"


def doctor_hash() -> str:
    """Changes when the doctor's code does: a result of another doctor is stale (one table, one doctor)."""
    import hashlib

    import attention_doctor
    root = Path(attention_doctor.__file__).parent
    h = hashlib.sha1()
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode() + p.read_bytes())
    return h.hexdigest()[:8]


def import_transformers():
    import torch  # noqa: F401  imported before the fork so every child inherits it
    import transformers  # noqa: F401

    import attention_doctor  # noqa: F401


def run(tasks: dict[str, list[str]], out: Path, *, checks, table: dict, hashes: dict[str, str],
        workers: int = 2, timeout_s: int = 600, cpu_s: int = 300, mem_bytes: int = 4 << 30,
        progress=print, body=run_arch, path=result_path, preload=import_transformers) -> None:
    """tasks: arch -> the implementations still to do. Each arch runs in its own process, which
    calls body(arch, impls, out, checks, table, hash, mem_bytes, cpu_s) (worker.run_arch) and
    writes path(out, arch, impl) for each impl. checks: the same for every arch, or a dict
    arch -> what that arch's body gets (the confirm reruns: impl -> check names). preload():
    imports what every child needs, before the fork, so that each inherits it."""
    preload()
    limits = {"timeout_s": timeout_s, "cpu_s": cpu_s}
    ctx = mp.get_context("fork")
    queue = list(tasks.items())
    running: dict[str, tuple] = {}  # arch -> (process, impls, started, killed_at)
    n, finished = len(queue), 0
    while queue or running:
        while queue and len(running) < workers:
            arch, impls = queue.pop(0)
            mem = (table["archs"].get(arch) or {}).get("mem_gb")
            p = ctx.Process(target=_child, name=f"zoo-{arch}", daemon=True,
                            args=(body, arch, impls, str(out), checks[arch] if isinstance(checks, dict) else checks,
                                  table, hashes[arch],
                                  int(mem * 2 ** 30) if mem else mem_bytes, cpu_s))
            p.start()
            running[arch] = (p, impls, time.monotonic(), None)
        time.sleep(0.05)
        for arch, (p, impls, started, killed_at) in list(running.items()):
            if p.is_alive():
                if killed_at is None and time.monotonic() - started > timeout_s:
                    p.kill()
                    running[arch] = (p, impls, started, time.monotonic())
                continue
            p.join()
            missing = [i for i in impls if not done(out, arch, i, hashes[arch], path)]
            if missing:
                status, reason = _died(p, killed_at, limits)
                tail = _log_tail(out, arch)
                for impl in missing:
                    write_json(path(out, arch, impl), {
                        "arch": arch, "impl": impl, "status": status, "reason": reason,
                        "log_tail": tail, "shrink_hash": hashes[arch],
                        "wall_s": round(time.monotonic() - started, 1)})
            del running[arch]
            finished += 1
            states = []
            for impl in impls:
                try:
                    states.append(f"{impl} {json.loads(path(out, arch, impl).read_text()).get('status', 'done')}")
                except (OSError, ValueError, KeyError):
                    states.append(f"{impl} ?")
            progress(f"[{finished}/{n}] {arch}: {', '.join(states)} ({time.monotonic() - started:.0f} s)")
