"""What a zoo run costs as a whole: wall time from the command's start (imports included) and CPU
time of the command and of every worker process it waited for (the checks, the builds, the
confirm reruns, the forks' imports). One entry per session in <out>/cost.json, rewritten after
each architecture, so a killed run keeps what it spent and a resumed one adds to it. Sessions of
another doctor or another release (another key) are not counted: their results were redone."""
import json
import os
import resource
import time
from pathlib import Path

from experiments.io import write_json

STARTED = time.monotonic()  # the command's start: doctor_lab.zoo.__main__ imports this first


def cpu_s() -> float:
    """CPU seconds of this process and of its children that have been waited for."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _path(out: Path) -> Path:
    return Path(out) / "cost.json"


def _sessions(out: Path) -> list[dict]:
    try:
        return json.loads(_path(out).read_text()).get("sessions", [])
    except (OSError, ValueError):
        return []


class Session:
    """This command's entry in cost.json, rewritten by record() (after each architecture)."""

    def __init__(self, out: Path, key: str, workers: int, reset: bool = False):
        self.out, self.key, self.workers = Path(out), key, workers
        self.id = f"{os.getpid()}-{time.time_ns()}"
        if reset:  # --redo over everything: what earlier sessions spent is no longer in the table
            write_json(_path(self.out), {"sessions": [s for s in _sessions(self.out) if s.get("key") != key]})
        self.counts: dict[str, int] = {}

    def record(self, what: str = "", n: int = 1) -> None:
        if what:
            self.counts[what] = self.counts.get(what, 0) + n
        mine = {"id": self.id, "key": self.key, "workers": self.workers, **self.counts,
                "wall_s": round(time.monotonic() - STARTED, 1), "cpu_s": round(cpu_s(), 1)}
        write_json(_path(self.out), {"sessions": [s for s in _sessions(self.out) if s.get("id") != self.id] + [mine]})


def total(out: Path, key: str) -> dict:
    """{wall_s, cpu_s, sessions, workers} summed over the sessions of `key` (empty: none)."""
    mine = [s for s in _sessions(out) if s.get("key") == key]
    if not mine:
        return {}
    return {"wall_s": round(sum(s["wall_s"] for s in mine), 1), "cpu_s": round(sum(s["cpu_s"] for s in mine), 1),
            "sessions": len(mine), "workers": sorted({s.get("workers") for s in mine}),
            "archs_run": sum(s.get("archs_run", 0) for s in mine)}
