"""Every command the README shows, run as written (issue 23): each in a fresh work dir (its own
empty results/, so no control is cached), with the default logger (W&B offline), through bash,
with only the sizes its entry in COMMANDS appends. A README command without an entry fails the
test: whoever adds one says here how it is shrunk (one line).

Checked for every command: its exit code, and the stdout / stderr / files its entry names. For
every run a command leaves (each summary.json under results/): no unexpected error; the verdict
line it printed (each check measured against its threshold) agrees with its summary.json; its
W&B run, read back from the offline .wandb file, holds the same status, verdict and final metrics;
a multirun prints one rate line per experiment. A shell assignment (`export X=...`, `P=...`)
is state for the lines after it in its block, not a command.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import CORPUS_REQUIRED, ROOT
from tests.wandb_offline import read_run


@dataclass(frozen=True)
class Cmd:
    add: str = ""      # appended to the command: sizes only (train.steps, batch, model / data sizes, a cut seed list)
    exit: int = 0
    stdout: str = ""   # a regex stdout must match
    stderr: str = ""   # a regex stderr must match
    files: tuple = ()  # globs that must exist in the work dir afterwards
    after: str = ""    # run in the work dir of this earlier README command (it reads that one's runs)
    cuda: bool = False  # without CUDA: exit 2 with one line naming it
    skip: str = ""     # not run, and why
    full: bool = False  # only with ATTN_README_FULL=1 (=only: these alone): the committed reference, shrunk


S = "train.steps=6 train.eval_batches=1"  # every run: 6 steps, one eval batch; sizes as configured
# and batches of 8 where no experiment needs its own (mask_broadcast needs batch == its queries: 32)
S8 = f"{S} train.batch_size=8"
# the catalogue's sweeps (25 jobs): 3 steps run every path a job has (train, eval, diagnostics, its control,
# the verdict, curves.png); a job's figure and Hydra's composing of its config cost more than its steps
# (measured on 2 cores: the seed-0 sweep 73 s at 3 steps, 89 s at 6)
S3 = "train.steps=3 train.eval_batches=1"
NO_SCALING = "python run.py +exp=no_scaling"
CATALOGUE = "python run.py -m '+exp=glob(*)' seed=0,1,2"
# the lesson's 32k-token model, shrunk: a 300-token vocabulary of 20,000 characters of one corpus, a
# 32-wide model, and of its 12 cells the GPT-2/AdamW twins (scaled, unscaled)
LESSON = ("data.vocab_size=300 'data.corpora=[python_source]' data.max_chars=20000 model.d_model=32 "
          "model.n_heads=2 model.init=gpt2 optim=adamw")
REPORTED = r"^report: \S+REPORT.md$"

COMMANDS = {
    # the front door
    "pip install -r requirements.txt && python run.py": Cmd(S8),
    "pytest": Cmd(skip="the suite itself (CI runs it)"),
    NO_SCALING: Cmd(S8),
    CATALOGUE: Cmd(f"{S3} seed=0", stdout=REPORTED),
    "python run.py -m +exp=heads seed=0": Cmd(S8, stdout=REPORTED),
    "python run.py -m +exp=lesson_scale hydra/launcher=parallel": Cmd(f"{S3} {LESSON}", stdout=REPORTED),
    "python run.py +exp=no_scaling data=shakespeare_char": Cmd(S8),
    "python run.py -m '+exp=glob(*)' data=shakespeare_char": Cmd(f"{S3} train.batch_size=8",
                                                                 stdout=r"^skipped: \S+mask_broadcast"),
    "python -m experiments.rejudge results/runs/no_scaling exp.checks.plateau.value=30":
        Cmd(after=NO_SCALING, stdout=r"^\[no_scaling\] reproduced: false \| .* plateau=\S+ \(>= 30; .*\) FAIL"),
    "python -m experiments.report": Cmd(after=NO_SCALING, files=("results/REPORT.md", "results/runs.csv")),
    # (the GPU commands are in docs/running.md)
    # the committed reference: every part at its sizes takes an hour and more; here the same command
    # with two parts shrunk (tests/test_reference.py kills and resumes it)
    "python -m experiments.reference": Cmd(f"--parts kv_sharing,default_run --no-readme {S} seed=0", full=True,
                                           files=("results/reference.json",)),
}


# -- the README's commands --------------------------------------------------------------------------

def _code(line: str) -> str:
    """A line without its trailing comment (a # after a space, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


STATE = re.compile(r"^(export\s+)?[A-Za-z_]\w*=\S*$|^(export\s+)?[A-Za-z_]\w*=\"[^\"]*\"$")


def readme_commands(text: str) -> list[tuple[str, list[str]]]:
    """(command, the shell state before it in its block) for every command of the bash blocks, in
    order, each once."""
    out, seen = [], set()
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
        state = []
        for line in block.replace("\\\n", " ").splitlines():
            cmd = _code(line.strip())
            if not cmd:
                continue
            if STATE.match(cmd):
                state.append(cmd)
            elif cmd not in seen:
                seen.add(cmd)
                out.append((cmd, list(state)))
    return out


README_COMMANDS = readme_commands((ROOT / "README.md").read_text())


def test_every_readme_command_has_an_entry_and_every_entry_a_command():
    missing = [c for c, _ in README_COMMANDS if c not in COMMANDS]
    assert not missing, f"README commands with no entry in COMMANDS (say how each is shrunk): {missing}"
    stale = [c for c in COMMANDS if c not in {c for c, _ in README_COMMANDS}]
    assert not stale, f"entries for commands the README no longer shows: {stale}"


# -- running one -------------------------------------------------------------------------------------

WORK: dict[str, Path] = {}  # command -> its work dir, for the commands that read another's runs


def work_dir(tmp: Path) -> Path:
    """A checkout without results/: the code linked, the README copied (--readme rewrites it)."""
    for p in ROOT.iterdir():
        if p.name in ("results", "README.md", ".git", ".pytest_cache") or p.name.startswith("."):
            continue
        (tmp / p.name).symlink_to(p)
    shutil.copy(ROOT / "README.md", tmp / "README.md")
    return tmp


def script(cmd: str, state: list[str], add: str) -> str:
    """The block's state, then the command with `add` appended (inside a for loop: before `; done`)."""
    line = f"{cmd[:-len('; done')]} {add}; done" if cmd.endswith("; done") else f"{cmd} {add}"
    return "\n".join([*state, "set -e", line.strip()])


def environment(bin_dir: Path) -> dict:
    """A user's: `python` (and `pip`, `pytest`) is this interpreter's, no W&B variables (the config's
    default decides). Its own bin dir goes first on PATH: a virtualenv's python started through a
    link made elsewhere is the base interpreter without the venv (Python looks for pyvenv.cfg beside
    the path it was started from). Where that dir has no `python` of its own (a system with python3
    only), bin_dir gets a `python` that execs this interpreter by its own path."""
    own = Path(sys.executable).parent
    path = [str(own)]
    if not is_this_python(own / "python"):
        bin_dir.mkdir(exist_ok=True)
        wrapper = bin_dir / "python"
        if not wrapper.exists():
            wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
            wrapper.chmod(0o755)
        path.insert(0, str(bin_dir))
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    return {**env, "PATH": os.pathsep.join([*path, env.get("PATH", "")]), "OMP_NUM_THREADS": "1"}


def is_this_python(p: Path) -> bool:
    """`p` starts this interpreter with its environment: the same file, or a venv's own `python`."""
    if not p.exists():
        return False
    return os.path.realpath(p) == os.path.realpath(sys.executable) or sys.prefix != sys.base_prefix


def test_the_users_python_is_this_interpreter_with_its_packages(tmp_path):
    """`python` as the README's commands find it is this interpreter, in this environment: the same
    sys.prefix (a venv's, not its base's) and this interpreter's packages importable."""
    code = "import sys, hydra; print(sys.prefix)"
    p = subprocess.run(["bash", "-c", f"python -c '{code}'"], capture_output=True, text=True,
                       env=environment(tmp_path / "bin"), timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == sys.prefix


NO_CORPUS = "no tiny Shakespeare corpus here (data/cache/ or ../shared/data/)"


def corpus_available() -> bool:
    from data.text import CACHE, SHARED
    return CACHE.is_file() or SHARED.is_file()


def cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


@dataclass
class Result:
    cmd: str
    work: Path
    returncode: int
    stdout: str
    stderr: str
    cpu_s: float  # user + system of the command and all it started (bash's `times`)


def execute(cmd: str, state: list[str], entry: Cmd, work: Path, bin_dir: Path) -> Result:
    cpu_file = work.parent / f"{work.name}.cpu"
    trap = f"trap 'times > {cpu_file}' EXIT"
    p = subprocess.run(["bash", "-c", f"{trap}\n{script(cmd, state, entry.add)}"], cwd=work, capture_output=True,
                       text=True, timeout=900, env=environment(bin_dir))
    times = re.findall(r"(\d+)m([\d.]+)s", cpu_file.read_text()) if cpu_file.exists() else []
    cpu = sum(int(m) * 60 + float(s) for m, s in times[2:])  # the children's user and system time
    print(f"readme: {cpu:.1f} CPU s: {cmd}", flush=True)  # with -s: what each command costs
    return Result(cmd, work, p.returncode, p.stdout, p.stderr, cpu)


def runnable(cmd: str, entry: Cmd | None) -> str:
    """Why this command is not run here, or ''."""
    if entry is None:
        return "no entry"
    if entry.skip:
        return entry.skip
    if entry.full and os.environ.get("ATTN_README_FULL") not in ("1", "only"):
        return "the committed reference: ATTN_README_FULL=1 runs it (shrunk, minutes)"
    if not entry.full and os.environ.get("ATTN_README_FULL") == "only":
        return "ATTN_README_FULL=only: the committed reference's lines alone"
    if needs_corpus(cmd) and not corpus_available():
        return NO_CORPUS
    return ""


def selected_exps(cmd: str) -> list[str]:
    """The experiments of conf/exp/ a command's `+exp=` selects (a name, a comma list, a glob), as
    Hydra's own override parser reads it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob
    m = re.search(r"\+exp=(glob\([^)]*\)|[^'\s]+)", cmd)
    if not m:
        return []
    every = sorted(f.stem for f in (ROOT / "conf" / "exp").glob("*.yaml"))
    override = OverridesParser.create().parse_override(m.group(0))
    value = override.value()
    chosen = value.filter(every) if isinstance(value, Glob) else (
        list(override.sweep_string_iterator()) if override.is_sweep_override() else [value])
    return [e for e in chosen if e in every]


def needs_corpus(cmd: str) -> bool:
    """Whether the command trains on tiny Shakespeare: named on its line, or chosen by an experiment
    it selects (attention_sink, in the catalogue's glob, overrides /data to shakespeare_lines)."""
    data_override = re.compile(r"override /data:\s*shakespeare")
    return "shakespeare" in cmd or any(data_override.search((ROOT / "conf" / "exp" / f"{e}.yaml").read_text())
                                       for e in selected_exps(cmd))


# two commands at a time, one per core; the reference's own (ATTN_README_FULL=1) run two jobs each
POOL = ThreadPoolExecutor(max_workers=1 if os.environ.get("ATTN_README_FULL") in ("1", "only") else 2)
STARTED: dict[str, Future] = {}


@pytest.fixture(scope="module", autouse=True)
def _pool():
    yield
    POOL.shutdown(wait=True, cancel_futures=True)  # a session stopped early starts no further command


def start_all(tmp_path_factory) -> None:
    """Every runnable command that needs no other's runs, started at once, two at a time in README
    order; each test then waits for its own."""
    bin_dir = tmp_path_factory.getbasetemp() / "bin"
    environment(bin_dir)
    for cmd, state in README_COMMANDS:
        entry = COMMANDS.get(cmd)
        if cmd not in STARTED and not runnable(cmd, entry) and not entry.after:
            work = work_dir(tmp_path_factory.mktemp("readme"))
            STARTED[cmd] = POOL.submit(execute, cmd, state, entry, work, bin_dir)


def test_a_command_needs_the_corpus_where_an_experiment_it_selects_trains_on_it():
    """Without the corpus, a README command that would train on it skips (or fails under
    ATTN_REQUIRE_CORPUS=1) instead of failing on the download: the catalogue's glob selects
    attention_sink, which trains on shakespeare_lines, though its line names no corpus."""
    assert needs_corpus(CATALOGUE) and "attention_sink" in selected_exps(CATALOGUE)
    assert not needs_corpus("python run.py -m '+exp=glob(*,exclude=attention_sink)' seed=0")
    assert selected_exps("python run.py -m +exp=heads,no_scaling seed=0") == ["heads", "no_scaling"]
    assert needs_corpus("python run.py +exp=no_scaling data=shakespeare_char")
    assert not needs_corpus("python run.py +exp=no_scaling")


@pytest.mark.parametrize("cmd,state", README_COMMANDS, ids=[c[:60] for c, _ in README_COMMANDS])
def test_readme_command(cmd, state, tmp_path_factory):
    entry = COMMANDS.get(cmd)
    if entry is None:
        pytest.fail(f"no entry in COMMANDS for the README command {cmd!r}")
    if why := runnable(cmd, entry):
        if why == NO_CORPUS and CORPUS_REQUIRED:
            pytest.fail(f"{why} [required: ATTN_REQUIRE_CORPUS=1]")
        pytest.skip(why)
    start_all(tmp_path_factory)
    if entry.after:
        base = STARTED.get(entry.after)
        if base is None or entry.after not in WORK:
            pytest.skip(f"needs the runs of {entry.after!r}, which did not run or failed")
        r = execute(cmd, state, entry, WORK[entry.after], tmp_path_factory.getbasetemp() / "bin")
    else:
        r = STARTED[cmd].result()
    tail = f"\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
    if entry.cuda and not cuda_available():  # the GPU command on a machine without one: one line, exit 2
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "CUDA" in lines[0], tail
        return
    assert r.returncode == entry.exit, tail
    if entry.stdout:
        assert re.search(entry.stdout, r.stdout, re.M), tail
    if entry.stderr:
        assert re.search(entry.stderr, r.stderr, re.M), tail
    for pattern in entry.files:
        assert list(r.work.glob(pattern)), f"{pattern} missing{tail}"
    if "run.py" in cmd:
        check_runs(r.work, r.stdout, multirun=" -m " in f" {cmd} ", tail=tail)
    WORK.setdefault(cmd, r.work)


# -- what every run must hold ---------------------------------------------------------------------

LINE = re.compile(r"^\[(?P<exp>[^\]]+)\] reproduced: (?P<rep>true|false)(?: \(signature also holds on the control: "
                  r"broken\))? \| status (?P<status>completed|diverged|error) \| (?P<checks>.*?) \| "
                  r"(?P<refs>(?:(?:control|floor|text model): (?:trained|reused \(\S+\)) \| )*)(?:[\d.]+s \| )?(?P<dir>\S+)$")
CHECK = re.compile(r"^(?P<key>\w+)(?:=\S+(?: \((?:<=|>=|<|>|==) [^)]*\))? (?:ok|FAIL|reported)"
                   r"|: not measurable on this data)$")


def summaries(work: Path) -> list[tuple[Path, dict]]:
    found = []
    for p in sorted((work / "results").rglob("summary.json")):
        if not any(part.startswith(".") or part in ("wandb", "checkpoints") for part in p.relative_to(work).parts):
            found.append((p.parent, json.loads(p.read_text())))
    return found


def finite(x):
    """x with every non-finite float as None: W&B writes NaN and inf in a summary as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def same(a, b) -> bool:
    """Equal as JSON, as W&B stores a summary (tuples as lists, NaN and inf as null)."""
    return json.dumps(finite(a), sort_keys=True) == json.dumps(finite(b), sort_keys=True)


def check_runs(work: Path, stdout: str, multirun: bool, tail: str):
    lines = {}
    for m in map(LINE.match, stdout.splitlines()):
        if m:
            lines[(work / m["dir"]).resolve()] = m
    runs = summaries(work)
    assert runs, f"no run left a summary.json{tail}"
    judged = set()
    for run_dir, s in runs:
        assert s["status"] != "error" or s.get("expected_error"), f"{run_dir}: {s.get('error')}{tail}"
        logged = s["config"]["logger"]["name"] == "wandb"  # the reference's lines say logger=none
        wb = read_run(run_dir)["summary"] if logged else {}  # its W&B run, read back from the .wandb file
        assert not logged or wb.get("status") == s["status"], f"{run_dir}: W&B status {wb.get('status')!r}{tail}"
        for k, v in s["final"].items() if logged else ():
            if k in s.get("measured_later", ()):  # a shared control measured for a later experiment
                assert f"final/{k}" not in wb
                continue
            assert same(wb.get(f"final/{k}"), v), f"{run_dir}: W&B final/{k} = {wb.get(f'final/{k}')!r}, not {v!r}"
        if "verdict" not in s:
            continue  # a control (or the floor): no verdict of its own
        judged.add(s["exp"])
        assert not logged or (same(wb.get("verdict"), s["verdict"]) and wb.get("reproduced") == s["verdict"]["reproduced"]), \
            f"{run_dir}: the W&B run's verdict differs from summary.json's{tail}"
        m = lines.get(run_dir.resolve())
        assert m is not None, f"{run_dir}: no verdict line{tail}"
        assert m["exp"] == s["exp"] and m["rep"] == str(s["verdict"]["reproduced"]).lower() and m["status"] == s["status"]
        if "reused" in (s.get("control") or {}):   # where the control came from: trained here, or reused
            assert ("control: reused (" if s["control"]["reused"] else "control: trained") in m["refs"], m.group(0)
        shown = [CHECK.match(c) for c in m["checks"].split(", ")]
        assert all(shown), f"{run_dir}: checks not as `key=measured (op threshold) ok|FAIL`: {m['checks']}"
        assert [c["key"] for c in shown] == [c["key"] for c in s["verdict"]["checks"]], m["checks"]
    if multirun:
        for exp in judged:
            assert re.search(rf"^verdict: {re.escape(exp)}\b.* of \d+ (seeds|runs) reproduced", stdout, re.M), \
                f"no rate line for {exp}{tail}"
