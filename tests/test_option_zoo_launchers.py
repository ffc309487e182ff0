"""The option zoo (`python -m doctor_lab.zoo --options`) on each launcher against one run on local
workers (a module fixture, run once): from the same option table, one submitit_local process per
job; and on the project's one-node SLURM cluster (test_slurm.py's fixture), its discovery and each
option set a SLURM job, then a second run that submits nothing. The tables agree row for row.
A file of its own, early in LONGEST_FIRST, so that it runs beside test_slurm.py's sweeps on another
worker (loadfile), not after them: the cluster queues both."""
import csv
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import ROOT  # noqa: E402
from test_slurm import ENV, cluster  # noqa: E402,F401  the fixture: the cluster up, or fail/skip as there

pytest.importorskip("transformers")

# one architecture, eager, two cheap checks (one of them runs a cache): its discovery and each option set a job
OPTION_ZOO = ["--options", "--arch", "llama", "--impl", "eager", "--checks", "future_leak,kv_cache", "--workers", "2"]
ON_SLURM = ["--launcher", "slurm", "--partition", "debug"]


def option_zoo(out: Path, *more: str) -> str:
    """The option zoo into `out`; its output. On a failure or a timeout its SLURM jobs are cancelled."""
    try:
        p = subprocess.run([sys.executable, "-m", "doctor_lab.zoo", *OPTION_ZOO, "--out", str(out), *more], cwd=ROOT,
                           env={**ENV, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        p = None
    if p is None or p.returncode != 0:
        jobs = sorted({f.name.split("_")[0] for f in out.glob("submitit/*_submitted.pkl")})
        if jobs:
            subprocess.run(["scancel", *jobs], env=ENV, capture_output=True, timeout=30)
        pytest.fail(f"option zoo {' '.join(more) or 'local'}: " + ("timed out" if p is None else
                    f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"))
    return p.stdout


def rows(out: Path) -> list[dict]:
    return list(csv.DictReader(open(out / "zoo.csv")))


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> Path:
    """The option zoo on forked local workers: the rows every launcher must give."""
    out = tmp_path_factory.mktemp("option_zoo") / "local"
    said = option_zoo(out)
    assert "zoo: options of llama:" in said and "s CPU" in said   # the cost of finding them, per architecture
    found = rows(out)
    assert len({r["options"] for r in found}) >= 3   # the default and the options found
    assert {r["options"] for r in found} >= {"", "rope_parameters=linear"}   # a rope type moves its outputs
    assert {r["status"] for r in found} == {"examined"}
    return out


def test_local_workers_and_submitit_local_give_the_same_rows(local, tmp_path):
    """From the same option table (the local run's discovery), one submitit_local process per job."""
    shutil.copytree(local / "discovery", tmp_path / "sub" / "discovery")
    said = option_zoo(tmp_path / "sub", "--launcher", "submitit_local")
    assert "submitit_local" in said and list((tmp_path / "sub" / "submitit").glob("*_result.pkl"))
    assert rows(tmp_path / "sub") == rows(local)


@pytest.mark.usefixtures("cluster")
def test_option_zoo_on_slurm_gives_the_rows_of_local_workers_and_resumes(local, tmp_path):
    """One command: the discovery, then a job per option set, each a SLURM job; the option table and
    the zoo's table are those of local workers; run again, it submits nothing and rewrites nothing."""
    said = option_zoo(tmp_path / "slurm", *ON_SLURM)
    found, slurm = rows(local), rows(tmp_path / "slurm")
    sets = {r["options"] for r in found}
    assert found == slurm, (found, slurm)
    assert (local / "options.csv").read_bytes() == (tmp_path / "slurm" / "options.csv").read_bytes()
    jobs = re.findall(r"\] (\S+): job (\d+) slurm", said)   # the discovery's job, then one per option set
    assert len(jobs) == 1 + len(sets) and len({j for _, j in jobs}) == len(jobs), said
    sub = tmp_path / "slurm" / "submitit"
    assert sorted(f.name for f in sub.glob("*_result.pkl")) == sorted(f"{j}_0_result.pkl" for _, j in jobs)
    # resumable: every result is there, so nothing is submitted and the tables are left as they are
    before = {f.name: f.read_bytes() for f in (tmp_path / "slurm").glob("*.csv")}
    files = sorted(f.name for f in sub.iterdir())
    again = option_zoo(tmp_path / "slurm", *ON_SLURM)
    assert "finding the options" not in again and "to run" not in again and " slurm (" not in again, again
    assert sorted(f.name for f in sub.iterdir()) == files
    assert {f.name: f.read_bytes() for f in (tmp_path / "slurm").glob("*.csv")} == before
