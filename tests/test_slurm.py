"""Sweeps through `hydra/launcher=slurm` on a real one-node SLURM cluster (slurmctld + slurmd,
brought up by experiments/slurm/local_cluster.sh): a job array with its report, a bad cell, a
control shared by two jobs, preemption (`scontrol requeue`) and a time limit, each resumed from
its checkpoint to the uninterrupted run's metrics.csv, byte for byte (the option zoo on the same
cluster: test_option_zoo_launchers.py).

Without a cluster these tests skip, saying how to start one; under CI (CI=true or
ATTN_REQUIRE_SLURM=1, which .ci/run sets) they fail instead. Every job takes one CPU."""
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest
from hydra.experimental.callback import Callback

sys.path.insert(0, str(Path(__file__).parent))  # also imported inside the SLURM jobs (Instrument)
from conftest import ROOT, TINY  # noqa: E402

SCRIPT = ROOT / "experiments" / "slurm" / "local_cluster.sh"
REQUIRED = os.environ.get("CI") == "true" or os.environ.get("ATTN_REQUIRE_SLURM") == "1"
CLUSTER_WAIT_S = 300  # a fresh machine's apt-get install and start: about a minute; five is a failure
ENV = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}  # never a job's own env
ENV.update(OMP_NUM_THREADS="1", WANDB_MODE="disabled", PYTHONWARNINGS="ignore")
SLURM = ["hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.gpus_per_node=0",
         "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1"]
# 200 steps, no periodic checkpoint: the only checkpoint a run writes is the one a signal asks for
LONG = [*TINY, "train.steps=200", "train.ckpt_every=0", "train.log_every=5", "train.diag_every=50"]


class Instrument(Callback):
    """A Hydra callback that runs inside each SLURM job: it appends what the job does (trainings,
    checkpoints, (re)starts) to a JSON-lines file the test reads, and slows the steps of a job's
    first attempt only, so a signal finds it training and the resumed attempt is quick. Sleeping
    changes no number in metrics.csv."""

    def __init__(self, record: str, first_attempt_step_s: float = 0.0):
        self.record, self.step_s = record, float(first_attempt_step_s)

    def _rec(self, event: str, **kw):
        with open(self.record, "a") as f:
            f.write(json.dumps({"event": event, "t": time.time(), **self.ids, **kw}) + "\n")

    def on_job_start(self, config, **kwargs):
        from experiments.training import loop as train
        from experiments.training import runner
        attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        array = os.environ.get("SLURM_ARRAY_JOB_ID")  # a sweep of one job is not an array
        task = f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array else os.environ["SLURM_JOB_ID"]
        self.ids = {"job": os.environ["SLURM_JOB_ID"], "task": task, "attempt": attempt}
        info = subprocess.run(["scontrol", "show", "job", os.environ["SLURM_JOB_ID"]],
                              capture_output=True, text=True).stdout
        times = {k: _epoch(v) for k, v in (f.split("=", 1) for f in info.split() if "=" in f)
                 if k in ("StartTime", "EndTime")}
        self._rec("job", **times)
        rec, step_s = self._rec, self.step_s if attempt == 0 else 0.0
        train_run, save, resume, step = (runner.train_run, train.Trainer.save_checkpoint,
                                         train.Trainer.try_resume, train.Trainer.train_step)

        def train_run_(cfg, run_dir, role, *a, **kw):
            rec("train", name=cfg["exp"]["name"], role=role)
            out = train_run(cfg, run_dir, role, *a, **kw)
            rec("trained", name=cfg["exp"]["name"], role=role)
            return out

        def save_(self):
            save(self)
            rec("checkpoint", step=self.step)

        def resume_(self):
            resumed = resume(self)
            rec("start", step=self.step, resumed=resumed)
            return resumed

        def step_(self, *a, **kw):
            time.sleep(step_s)
            return step(self, *a, **kw)

        runner.train_run, train.Trainer.save_checkpoint = train_run_, save_
        train.Trainer.try_resume, train.Trainer.train_step = resume_, step_


def _epoch(s: str) -> float:
    return time.mktime(datetime.strptime(s, "%Y-%m-%dT%H:%M:%S").timetuple())


def instrument(record: Path, step_s: float = 0.0) -> list[str]:
    cb = "+hydra.callbacks.instrument"
    return [f"{cb}._target_=tests.test_slurm.Instrument", f"{cb}.record={record}",
            f"{cb}.first_attempt_step_s={step_s}"]


def events(record: Path) -> list[dict]:
    return [json.loads(l) for l in record.read_text().splitlines()] if record.exists() else []


@pytest.fixture(scope="module")
def cluster():
    """The local cluster must be up; the tests never start daemons. Where it is required, it may
    still be coming up (`.ci/run` installs and starts it beside the tests): waited for, up to
    CLUSTER_WAIT_S, before the tests fail."""
    deadline = time.monotonic() + (CLUSTER_WAIT_S if REQUIRED else 0)
    while (p := subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True,
                               timeout=30)).returncode != 0 and time.monotonic() < deadline:
        time.sleep(2)
    if p.returncode != 0:
        why = subprocess.run(["bash", str(SCRIPT), "check"], capture_output=True, text=True, timeout=30)
        reason = (f"no SLURM cluster ({p.stdout.strip()}; {(why.stdout + why.stderr).strip()}); "
                  f"start one with `sudo {SCRIPT.relative_to(ROOT)} up`")
        if REQUIRED:
            pytest.fail(reason + " [required: CI / ATTN_REQUIRE_SLURM=1]")
        pytest.skip(reason)


def squeue(*args) -> list[str]:
    p = subprocess.run(["squeue", "-h", *args], capture_output=True, text=True, timeout=30, env=ENV)
    return p.stdout.split()


def sweep(results: Path, args: list[str], timeout: float, on_poll=None) -> tuple[int, str, Path]:
    """`python run.py -m ... hydra/launcher=slurm` until it exits; returns (code, output, sweep dir).
    SLURM holds a requeued job for 120 s (BeginTime, fixed in slurmctld); a poll releases it, as
    an operator would with `scontrol update StartTime=now`, once it has been held a few seconds:
    released at once, it can be allocated before its old credential is revoked, and slurmctld
    then kills it ("Killing non-startable batch job: Job credential revoked"). On a timeout the
    jobs are cancelled and the test fails with the jobs' logs."""
    results.mkdir(parents=True, exist_ok=True)
    out = results / "sweep.out"
    with open(out, "w") as f:
        p = subprocess.Popen([sys.executable, "run.py", "-m", *args, f"results_dir={results}", *SLURM],
                             cwd=ROOT, env=ENV, stdout=f, stderr=subprocess.STDOUT)
    deadline = time.time() + timeout
    held_since: dict[str, float] = {}
    try:
        while p.poll() is None and time.time() < deadline:
            held = squeue("-t", "PD", "-o", "%i|%r")
            for job in (j.split("|")[0] for j in held if j.endswith("|BeginTime")):
                if time.time() - held_since.setdefault(job, time.time()) < 3:
                    continue
                subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=ENV,
                               capture_output=True, timeout=30)
                held_since.pop(job)
            if on_poll:
                on_poll()
            time.sleep(0.5)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
            code = None
        else:
            code = p.returncode
    [sweep_dir] = (results / "multirun").iterdir()
    if code is None:
        jobs = {t.split("_")[0] for t in array_tasks(sweep_dir)}
        subprocess.run(["scancel", *sorted(jobs)], env=ENV, capture_output=True, timeout=30)
        pytest.fail(f"sweep still running after {timeout} s\n{out.read_text()[-2000:]}\n{logs(sweep_dir)[-4000:]}")
    return code, out.read_text(), sweep_dir


def array_tasks(sweep_dir: Path) -> list[str]:
    """The SLURM ids (ARRAY_TASK) of a sweep's jobs, from submitit's folders."""
    return sorted(d.name for d in (sweep_dir / ".submitit").iterdir()
                  if re.fullmatch(r"\d+(_\d+)?", d.name) and not (sweep_dir / ".submitit" / f"{d.name}_0").exists())


def logs(sweep_dir: Path) -> str:
    return "".join(f"== {p.name}\n{p.read_text()}" for p in sorted(sweep_dir.glob(".submitit/*/*_log.*")))


def reference_metrics(results: Path, args: list[str]) -> bytes:
    """The same run, uninterrupted, without SLURM."""
    p = subprocess.run([sys.executable, "run.py", *args, f"results_dir={results}"], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    [run] = (results / "runs" / "baseline").iterdir()
    return (run / "metrics.csv").read_bytes()


@pytest.fixture(scope="module")
def long_ref(cluster, tmp_path_factory) -> Future:
    """LONG's metrics.csv, uninterrupted, without SLURM: what the preempted and the timed-out job
    must each end with. One run for both, started in a thread beside the first of their sweeps (not
    beside the array sweep, whose two jobs must start together); each takes its .result() to compare."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool.submit(reference_metrics, tmp_path_factory.mktemp("long_ref"), LONG)


# -- one job array: two good cells that share a control, two bad cells ------------------------
@pytest.fixture(scope="module")
def array_sweep(cluster, tmp_path_factory):
    """sum_normalize with softmax=sum and softmax=naive: two failures, one control (softmax=stable,
    everything else equal); n_heads=3 does not divide d_model=32, so those two cells are bad
    input. Jobs 0 and 1 start together on two CPUs and reach the control's lock together."""
    results = tmp_path_factory.mktemp("array")
    record = results / "record.jsonl"
    args = [*TINY, "+exp=sum_normalize", "model.n_heads=2,3", "model.attention.softmax=sum,naive",
            "hydra.launcher.timeout_min=5", *instrument(record, 0.2)]
    code, out, sweep_dir = sweep(results, args, timeout=240)
    return code, out, sweep_dir, events(record)


def test_job_array_runs_the_sweep_and_writes_its_report(array_sweep):
    code, out, sweep_dir, rec = array_sweep
    jobs = array_tasks(sweep_dir)
    assert len(jobs) == 4 and {j.split("_")[0] for j in jobs} == {jobs[0].split("_")[0]}, jobs  # an array
    good = [json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/summary.json"))]
    assert sorted(s["config"]["model"]["attention"]["softmax"] for s in good) == ["naive", "sum"]
    assert len(good) == 2 and all(s["config"]["model"]["n_heads"] == 2 for s in good)
    assert all(s["status"] in ("completed", "diverged") and s["verdict"] for s in good)
    assert (sweep_dir / "REPORT.md").exists() and f"report: {sweep_dir / 'REPORT.md'}" in out
    assert sorted({e["task"] for e in rec if e["event"] == "trained"}) == jobs[:2]


def test_bad_cell_is_recorded_with_its_line_and_the_exit_code_says_so(array_sweep):
    """A rejected cell writes no summary (nothing recorded as a run); its one line is in its job's
    SLURM log and in the multirun's last lines, which name it as crashed, and the multirun exits 1."""
    code, out, sweep_dir, _ = array_sweep
    assert code == 1, out[-3000:]
    line = "error: [sum_normalize] model.d_model=32 is not divisible by model.n_heads=3"
    bad = sorted(d.name for d in sweep_dir.iterdir() if (d / ".hydra").is_dir() and not (d / "summary.json").exists())
    assert bad == ["2_sum_normalize_seed0", "3_sum_normalize_seed0"]
    for name in bad:
        assert f"crashed: {name}: config rejected: {line[len('error: [sum_normalize] '):]}" in out
    assert "2 of 4 jobs crashed unexpectedly" in out
    tasks = array_tasks(sweep_dir)  # array task i is Hydra job i
    for t in tasks[2:]:
        [err] = [l for l in (sweep_dir / ".submitit" / t / f"{t}_0_log.err").read_text().splitlines()
                 if l.startswith("error:")]
        assert err.startswith(line), err
        assert "Traceback" not in (sweep_dir / ".submitit" / t / f"{t}_0_log.err").read_text()


def test_two_jobs_sharing_a_control_train_it_once(array_sweep):
    _, out, sweep_dir, rec = array_sweep
    controls = [e for e in rec if e["event"] == "train" and e["role"] == "control"]
    assert len(controls) == 1, rec                       # trained once, by one of the two jobs
    fails = {e["task"]: e["t"] for e in rec if e["event"] == "train" and e["role"] == "failure"}
    done = {e["task"]: e["t"] for e in rec if e["event"] == "trained" and e["role"] == "failure"}
    assert len(fails) == 2
    # the two jobs ran at the same time, so the second met the first's lock on the control
    assert max(fails.values()) < min(done.values()), rec
    dirs = {json.loads(p.read_text())["control"]["dir"] for p in sweep_dir.glob("*/summary.json")}
    assert len(dirs) == 1 and len(list(Path(dirs.pop()).parent.iterdir())) == 1


# -- preemption and time limit: checkpoint, requeue, resume, same bytes -----------------------
def resumed_once(rec: list[dict]) -> int:
    """The step the first attempt checkpointed at, which the second attempt resumed from."""
    ckpts = [e for e in rec if e["event"] == "checkpoint"]
    starts = [(e["attempt"], e["step"], e["resumed"]) for e in rec if e["event"] == "start"]
    assert len(ckpts) == 1 and ckpts[0]["attempt"] == 0, rec
    k = ckpts[0]["step"]
    assert 0 < k < 200 and starts == [(0, 0, False), (1, k, True)], rec
    return k


def test_preempted_job_is_requeued_and_resumes_identically(long_ref, time_limited, tmp_path):
    """Beside the time-limited sweep (time_limited: each job on its own CPU of the two)."""
    res, record = tmp_path / "slurm", tmp_path / "record.jsonl"
    requeued = []

    def preempt():  # once the first attempt has trained a second: requeue it, as a preemption would
        starts = [e for e in events(record) if e["event"] == "start"]
        if not requeued and starts and time.time() - starts[0]["t"] > 1.0:
            requeued.append(starts[0]["task"])
            subprocess.run(["scontrol", "requeue", starts[0]["task"]], env=ENV, check=True, timeout=30)

    code, out, sweep_dir = sweep(res, [*LONG, "hydra.launcher.timeout_min=5", *instrument(record, 0.1)],
                                 timeout=180, on_poll=preempt)
    assert code == 0 and requeued, out[-3000:]
    rec = events(record)
    k = resumed_once(rec)
    log = logs(sweep_dir)
    # scontrol requeue sends SIGTERM: the trainer checkpoints at the next step and exits
    assert f"preempted: signal SIGTERM at step {k}; checkpoint written" in log, log[-3000:]
    [job] = [d for d in sweep_dir.iterdir() if (d / "summary.json").exists()]
    assert json.loads((job / "summary.json").read_text())["status"] == "completed"
    assert (job / "metrics.csv").read_bytes() == long_ref.result()
    assert not list(res.glob("checkpoints/*/ckpt.pt"))


SIGNAL_DELAY_S = 5


@pytest.fixture(scope="module")
def time_limited(cluster, tmp_path_factory) -> Future:
    """The time-limited sweep, started in a thread when the preempted job's test begins and run
    beside it: most of its minute is the wait for its limit, which the other sweep's job spends
    on the node's other CPU (one after the other, the two tests took 119 s; the array sweep runs
    alone: its two jobs must start together). Yields (code, output, sweep dir, record)."""
    res = tmp_path_factory.mktemp("time_limit")
    record = res / "record.jsonl"
    args = [*LONG, "hydra.launcher.timeout_min=1", f"hydra.launcher.signal_delay_s={SIGNAL_DELAY_S}",
            "hydra.launcher.max_num_timeout=1", *instrument(record, 0.3)]
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool.submit(lambda: (*sweep(res / "slurm", args, timeout=200), record))


def test_time_limit_signals_checkpoints_requeues_and_resumes_identically(long_ref, time_limited):
    """A 1-minute limit and a first attempt slowed to 100 s. slurmctld checks limits every 30 s
    and sends USR2 at the first check within 30 s of (limit - signal_delay_s), so it arrives
    15..45 s into the job, 15..45 s before the limit (measured): submitit's handler takes it as
    a time-out (max_num_timeout), the trainer checkpoints, the job is requeued and finishes."""
    code, out, sweep_dir, record = time_limited.result()
    log = logs(sweep_dir)
    assert code == 0, out[-3000:] + log[-3000:]
    rec = events(record)
    k = resumed_once(rec)
    assert "Caught signal SIGUSR2" in log and "this job is timed-out" in log, log[-3000:]
    assert "Requeued job" in log and "0 remaining timeouts" in log, log[-3000:]
    [job0] = [e for e in rec if e["event"] == "job" and e["attempt"] == 0]
    [ckpt] = [e for e in rec if e["event"] == "checkpoint"]
    lead = job0["EndTime"] - ckpt["t"]  # how long before the limit the checkpoint was on disk
    print(f"time limit: checkpoint at step {k}, {ckpt['t'] - job0['StartTime']:.1f} s into the job, "
          f"{lead:.1f} s before its limit (signal_delay_s={SIGNAL_DELAY_S})")
    assert job0["EndTime"] - job0["StartTime"] == 60
    assert SIGNAL_DELAY_S - 2 <= lead <= SIGNAL_DELAY_S + 60, (lead, rec)
    [job] = [d for d in sweep_dir.iterdir() if (d / "summary.json").exists()]
    assert (job / "metrics.csv").read_bytes() == long_ref.result()
    assert json.loads((job / "summary.json").read_text())["steps_done"] == 200
