"""The option zoo (`python -m doctor_lab.zoo --options --launcher slurm`) on the project's one-node
SLURM cluster (test_slurm.py's fixture): its discovery and each option set a SLURM job, whose tables
are those of local workers, and a second run that submits nothing. A file of its own so that it runs
beside test_slurm.py's sweeps on another worker (loadfile), not after them: the cluster queues both."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import ROOT  # noqa: E402
from test_slurm import ENV, cluster  # noqa: E402,F401  the fixture: the cluster up, or fail/skip as there

# one architecture, eager, one cheap check: its discovery and each option set a SLURM job
OPTION_ZOO = ["--options", "--arch", "llama", "--impl", "eager", "--checks", "future_leak", "--workers", "2"]
ON_SLURM = ["--launcher", "slurm", "--partition", "debug"]


def option_zoo(out: Path, *more: str) -> str:
    """The option zoo into `out`; its output. On a failure or a timeout its SLURM jobs are cancelled."""
    try:
        p = subprocess.run([sys.executable, "-m", "doctor_lab.zoo", *OPTION_ZOO, "--out", str(out), *more], cwd=ROOT,
                           env={**ENV, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        p = None
    if p is None or p.returncode != 0:
        jobs = sorted({f.name.split("_")[0] for f in out.glob("submitit/*_submitted.pkl")})
        if jobs:
            subprocess.run(["scancel", *jobs], env=ENV, capture_output=True, timeout=30)
        pytest.fail(f"option zoo {' '.join(more) or 'local'}: " + ("timed out" if p is None else
                    f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"))
    return p.stdout


@pytest.mark.usefixtures("cluster")
def test_option_zoo_on_slurm_gives_the_rows_of_local_workers_and_resumes(tmp_path):
    """One command: the discovery, then a job per option set, each a SLURM job; the option table and
    the zoo's table are those of local workers; run again, it submits nothing and rewrites nothing."""
    pytest.importorskip("transformers")
    import csv
    option_zoo(tmp_path / "local")
    said = option_zoo(tmp_path / "slurm", *ON_SLURM)
    local, slurm = (list(csv.DictReader(open(tmp_path / d / "zoo.csv"))) for d in ("local", "slurm"))
    sets = {r["options"] for r in local}
    assert local == slurm and len(sets) >= 3 and {r["status"] for r in local} == {"examined"}, (local, slurm)
    assert (tmp_path / "local" / "options.csv").read_bytes() == (tmp_path / "slurm" / "options.csv").read_bytes()
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
