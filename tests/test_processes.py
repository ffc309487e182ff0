"""The suite runs in a plain shell, whatever the machine's thread defaults: no test forks the test
process (a child forked after torch started its OpenMP threads can wait on a futex forever, and
earlier tests start them); a child Python is a new process (conftest.run_py)."""
import ast
import os
import subprocess
import sys

from conftest import ROOT, TINY

FORKS = {("os", "fork"), ("os", "forkpty"), ("runner", "run")}   # the zoo's runner forks its workers


def forks_in(path) -> list[str]:
    """Where a module forks: os.fork()/forkpty(), the zoo's runner.run(), or a multiprocessing "fork"
    context / start method."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and (f.value.id, f.attr) in FORKS:
            found.append(f"{path.name}:{node.lineno}: {f.value.id}.{f.attr}()")
        if isinstance(f, ast.Attribute) and f.attr in ("get_context", "set_start_method") and any(
                isinstance(a, ast.Constant) and a.value == "fork" for a in node.args):
            found.append(f"{path.name}:{node.lineno}: {f.attr}('fork')")
    return found


def test_no_test_forks_the_test_process():
    found = [hit for p in sorted((ROOT / "tests").glob("test_*.py")) for hit in forks_in(p)]
    assert not found, "\n".join(found)


def test_the_scan_sees_a_fork(tmp_path):
    src = tmp_path / "t.py"
    src.write_text("import os, multiprocessing as mp\npid = os.fork()\nctx = mp.get_context('fork')\nrunner.run({})\n")
    assert forks_in(src) == ["t.py:2: os.fork()", "t.py:3: get_context('fork')", "t.py:4: runner.run()"]


def test_a_run_started_after_openmp_threads_ran_finishes(tmp_path):
    """What hung the suite: a process whose OpenMP pool runs 2 threads starts a training run.
    Through conftest.run_py (a new process) it finishes."""
    code = ("import sys, torch; sys.path.insert(0, 'tests'); torch.set_num_threads(2)\n"
            "x = torch.randn(256, 256)\n"
            "for _ in range(5): x = torch.tanh(x @ x)  # the OpenMP pool is up\n"
            "from conftest import run_py\n"
            f"p = run_py({[*TINY, f'results_dir={tmp_path}']!r})\n"
            "print(p.returncode, p.stderr[-2000:])\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0 and p.stdout.startswith("0 "), p.stdout + p.stderr
    assert len(list(tmp_path.glob("runs/baseline/*/summary.json"))) == 1


def test_ci_runs_the_readme_command_with_a_users_environment():
    """.ci/run exports only switches that make CI stricter; what the suite needs, it sets itself."""
    lines = [l.strip() for l in (ROOT / ".ci" / "run").read_text().splitlines() if not l.strip().startswith("#")]
    exported = [w.split("=")[0] for l in lines if l.startswith("export ") for w in l.split()[1:]]
    assert exported == ["ATTN_REQUIRE_SLURM", "ATTN_REQUIRE_CORPUS"], exported
    assert lines[-1] == "pytest"  # the README's `pytest`, nothing added
    # run as a user installs: in a virtualenv made in the clone, the README's install into it, linted first
    venv, activate = lines.index("python3 -m venv .venv"), lines.index(". .venv/bin/activate")
    install = next(i for i, l in enumerate(lines) if l.startswith("python -m pip install") and "-r requirements.txt" in l)
    assert venv < activate < install < lines.index("ruff check .") < len(lines) - 1
