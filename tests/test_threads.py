"""train.threads=auto: the free cores at the run's start, from fake readings of the machine."""
import pytest

from experiments.training import threads as th


@pytest.mark.parametrize("busy, cores, want", [
    (0, 2, 2), (0.4, 2, 2),     # quiet: every core
    (1, 2, 1), (2, 2, 1), (11, 2, 1),   # busy: one thread, never zero
    (1, 16, 15), (3.6, 8, 4),
])
def test_auto_takes_the_cores_left_by_the_other_runnable_processes(busy, cores, want):
    n, why = th.choose("auto", None, cores, busy)
    assert n == want and why.startswith("auto:") and f"{cores} cores" in why


def test_an_explicit_setting_wins_then_omp_num_threads_then_the_reading():
    assert th.choose(3, "1", 2, 0) == (3, "train.threads")
    assert th.choose(None, None, 2, 0) == (None, "torch's default")
    assert th.choose("auto", "1", 16, 0) == (1, "OMP_NUM_THREADS=1")   # a launcher's (the reference's) choice
    assert th.choose("auto", "junk", 2, 0)[0] == 2                       # not a count: the reading decides
    assert th.choose("auto", None, 2, None) == (1, "auto: the machine's load is unknown")


def test_runnable_processes_are_read_from_proc_stat_without_this_one(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3\nprocs_running 3\nprocs_blocked 0\n")
    assert th.runnable_now(stat, samples=3, interval_s=0) == 2   # this process reading is one of the 3
    stat.write_text("cpu  1 2 3\n")
    assert th.runnable_now(stat, samples=3, interval_s=0) is None
    assert th.runnable_now(tmp_path / "absent", samples=1) is None


def test_auto_threads_reads_the_machine_and_falls_back_to_the_load_average(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(th, "usable_cores", lambda: 4)
    monkeypatch.setattr(th, "runnable_now", lambda: 1.0)
    assert th.auto_threads("auto") == (3, "auto: 1 other runnable of 4 cores")
    monkeypatch.setattr(th, "runnable_now", lambda: None)
    monkeypatch.setattr(th, "load_average", lambda: 3.7)
    assert th.auto_threads("auto")[0] == 1
    assert th.auto_threads(2) == (2, "train.threads")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # it wins: the machine is not read (a tenth of a second)
    monkeypatch.setattr(th, "runnable_now", lambda: pytest.fail("read although OMP_NUM_THREADS is set"))
    assert th.auto_threads("auto") == (2, "OMP_NUM_THREADS=2")


def test_the_schema_takes_auto_a_count_or_null_and_nothing_else():
    from experiments.config import compose
    from experiments.schema import validate
    cfg = compose([])
    assert cfg["train"]["threads"] == "auto"   # the default (conf/train/cpu.yaml)
    for ok in ("auto", 1, 4, None):
        validate({**cfg, "train": {**cfg["train"], "threads": ok}})
    for bad in (0, 1.5, "all", True):
        with pytest.raises(ValueError, match="train.threads"):
            validate({**cfg, "train": {**cfg["train"], "threads": bad}})
