"""What the suite needs it sets here, so that `pytest` in a plain shell is the command CI runs
(.ci/run exports only switches that make CI stricter: ATTN_REQUIRE_SLURM, ATTN_REQUIRE_CORPUS)."""
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("MPLBACKEND", "Agg")
if "PYTEST_XDIST_WORKER" in os.environ:   # pytest.ini runs one worker per core: one torch thread each,
    os.environ.setdefault("OMP_NUM_THREADS", "1")   # oversubscribed OpenMP threads spin (before torch loads)


@pytest.hookimpl(optionalhook=True)   # xdist's hook: `-p no:xdist` runs without it
def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pytest.ini): a worker per usable core (--maxprocesses caps it). Not one more for
    the SLURM and submitit tests that wait on their jobs: their jobs, the README's commands (two at
    a time) and the tests' own processes keep the cores busy; on 2 cores, one fresh clone each,
    3 workers took 434 s of pytest and 777 s of CPU, 2 workers 403 s and 692 s."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# The files that take longest start first (xdist gives each worker whole files, in this order:
# pytest.ini's --no-loadscope-reorder). Ordered by the test count, xdist started the SLURM file
# 48th of 66 and the submitit one 54th, so their minutes of waiting on jobs ended the run with one
# core idle. Measured (`pytest --durations=0`, seconds per file in its worker, 2 workers): the SLURM
# tests 154 (waiting on their jobs: first, so that the wait overlaps everything), the README's
# commands 162, the launchers 97, then 52 down to 22; the rest keep xdist's order, most tests first.
LONGEST_FIRST = ("test_slurm.py", "test_option_zoo_launchers.py", "test_readme_commands.py", "test_launchers.py", "test_reference.py", "test_zoo.py",
                 "test_report.py", "test_findings.py", "test_zoo_libraries.py", "test_run.py", "test_resume.py",
                 "test_bad_input.py", "test_notebooks.py")


def pytest_collection_modifyitems(config, items):
    per_file = Counter(item.path.name for item in items)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    # stable: each file's tests keep their order
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), -per_file[item.path.name], str(item.path)))


# The tiny Shakespeare corpus is not in the repository (users download it once; CI has ../shared).
# Without it the corpus tests skip, saying so; under ATTN_REQUIRE_CORPUS=1 (.ci/run) they fail.
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
CORPUS_REQUIRED = os.environ.get("ATTN_REQUIRE_CORPUS") == "1"


def require_corpus() -> None:
    """Skip the calling test without the corpus, or fail it where the corpus is required."""
    if not SHAKESPEARE.is_file():
        why = f"no tiny Shakespeare corpus at {SHAKESPEARE}"
        if CORPUS_REQUIRED:
            pytest.fail(why + " [required: ATTN_REQUIRE_CORPUS=1]")
        pytest.skip(why)


@pytest.fixture
def corpus() -> Path:
    """The tiny Shakespeare corpus (require_corpus: skip without it, fail where it is required)."""
    require_corpus()
    return SHAKESPEARE


needs_corpus = pytest.mark.usefixtures("corpus")


def run_py(args, cwd=ROOT, env=None, timeout=300) -> subprocess.CompletedProcess:
    """`python run.py ARGS`, as a user types it, in a new process: never a fork of this one (a
    child forked after torch started its OpenMP threads here can wait on a futex forever)."""
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture
def compose_cfg():
    """Compose conf/ through Hydra's compose API, returning a plain dict as run.py sees it."""
    from experiments.config import compose

    def _compose(overrides=(), results_dir=None):
        d = compose(overrides)
        if results_dir is not None:
            d["results_dir"] = str(results_dir)
        return d
    return _compose


TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "data.vocab_size=8",
        "data.seq_len=16", "train.steps=6", "train.batch_size=4", "train.log_every=2",
        "train.diag_every=3", "train.eval_batches=1", "logger=none", "train.progress=false"]


@pytest.fixture
def tiny():
    return list(TINY)


def pad(right, left, with_positions=None, limit=1e-05) -> dict:
    """A padding row's measurements, as the doctor's schema names them."""
    m = {"right": right, "left": left, "limit": limit}
    return m if with_positions is None else {**m, "left_with_positions": with_positions}
