"""`python -m attention_doctor`: exit codes 0 / 1 / 2 (3: tests/test_doctor_outcomes.py), one-line errors, nothing written on exit 2,
and the --json rows."""
import json
import subprocess
import sys

import pytest
import torch.nn as nn

from attention_doctor.cli import main
from conftest import ROOT


def healthy():
    """A zero-argument factory: nanoGPT's causal self-attention (experiments/bench/)."""
    from experiments.bench.nanogpt_reference import CausalSelfAttention
    return CausalSelfAttention(16, 2)


def raises():
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 16)

        def forward(self, x):
            raise RuntimeError("boom")
    return Broken()


NOT_A_MODULE = 42


def run(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_exit_1_on_a_failed_check_with_json(tmp_path, capsys):
    f = tmp_path / "r.json"
    code, out, err = run(["self:model.attention.merge=no_transpose", "--json", str(f)], capsys)
    assert code == 1 and "future_leak" in out and "fail" in out
    j = json.loads(f.read_text())
    assert j["target"] == "self:model.attention.merge=no_transpose"
    assert [c["name"] for c in j["checks"]][:3] == ["finite_output", "eval_dropout", "future_leak"]
    row = next(c for c in j["checks"] if c["name"] == "future_leak")
    assert set(row) == {"name", "outcome", "reason", "cause", "measured", "tolerance", "measurements", "experiment",
                        "thread", "detail", "verdict"}
    assert j["exit_code"] == 1
    assert row["outcome"] == row["verdict"] == "fail" and row["measured"] > 0 and row["experiment"] == "head_merge_no_transpose"
    assert row["cause"] == "outputs_move" and row["measurements"]["limit"] == 1e-6


def test_exit_0_on_a_healthy_module_target(tmp_path, capsys):
    f = tmp_path / "r.json"
    code, out, _ = run(["test_doctor_cli:healthy", "--json", str(f)], capsys)
    assert code == 0, out
    assert "nothing failed" in out and json.loads(f.read_text())["checks"]


@pytest.mark.parametrize("args,says", [
    (["no_such_pkg.mod:obj"], "cannot import no_such_pkg.mod"),
    (["test_doctor_cli:NOT_A_MODULE"], "not a torch.nn.Module"),
    (["test_doctor_cli:missing"], "has no missing"),
    (["test_doctor_cli:raises"], "forward raised"),
    (["self:model.attention.merge=sideways"], "merge"),
    (["self:model.nonsense=1"], "self:"),
    (["hf:"], "hf: needs a model type"),
    (["test_doctor_cli:healthy", "--dtype", "int8"], "--dtype"),
    (["test_doctor_cli:healthy", "--device", "cuda:7"], "cuda"),
    (["test_doctor_cli:healthy", "--attn-impl", "sdpa"], "hf: targets only"),
    (["test_doctor_cli:healthy", "--bogus"], "unrecognized arguments"),
])
def test_exit_2_one_line_nothing_written(args, says, tmp_path, capsys):
    f = tmp_path / "r.json"
    code, out, err = run(args + ["--json", str(f)], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and says in err and "Traceback" not in err
    assert not f.exists() and out == ""


def test_a_file_path_names_a_target(tmp_path, capsys, monkeypatch):
    """`cases/lm.py:factory`, as a user types a file they wrote: imported from the file (its own
    folder first on sys.path, for its sibling imports); a missing file answers with the dotted form."""
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "helper_mod.py").write_text("WIDTH = 16\n")
    (tmp_path / "cases" / "file_lm.py").write_text(
        "from helper_mod import WIDTH\n"
        "from experiments.bench.nanogpt_reference import CausalSelfAttention\n"
        "def healthy():\n    return CausalSelfAttention(WIDTH, 2)\n"
        "NOT_A_MODULE = 7\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    code, out, err = run(["cases/file_lm.py:healthy", "--checks", "future_leak"], capsys)
    assert code == 0 and "future_leak" in out and "pass" in out, out + err
    code, _, err = run(["cases/file_lm.py:NOT_A_MODULE"], capsys)
    assert code == 2 and "not a torch.nn.Module" in err
    code, _, err = run(["cases/nowhere.py:healthy"], capsys)
    assert code == 2 and "no file cases/nowhere.py" in err and "cases.nowhere:" in err
    assert len(err.strip().splitlines()) == 1


def test_the_real_command_line(tmp_path):
    """`python -m attention_doctor` in a process of its own: exit 2 with one line, no traceback."""
    p = subprocess.run([sys.executable, "-m", "attention_doctor", "no_such_pkg:thing"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().startswith("attention-doctor: no_such_pkg:thing: cannot import")
    assert len(p.stderr.strip().splitlines()) == 1


def test_pyproject_names_the_command():
    import tomllib
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["scripts"]["attention-doctor"] == "attention_doctor.cli:main"
    assert meta["tool"]["setuptools"]["packages"]["find"]["include"] == ["attention", "attention.*", "attention_doctor", "attention_doctor.*"]
