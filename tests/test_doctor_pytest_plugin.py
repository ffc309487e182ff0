"""The doctor's pytest plugin in a maintainer's own project, outside the clone: a tmp project with
the worked example's model (docs/examples/ci_project/tiny_lm) and a test file of its own, run by
`pytest` in a subprocess with the plugin loaded as its entry point would load it (`-p`; the
package is on PYTHONPATH, not installed). A healthy model passes; a planted bug fails with its
check as the test id and its cause in the message; a baselined expected fail xfails; the same
check failing with another cause fails; a baselined fail that now passes is XPASS and listed, and
fails under --attention-doctor-strict; each model is built and examined once, not once per check;
--attention-doctor-json keeps one result per model; the model a test shares comes back as it was
(mode, dtype, parameters, buffers)."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "ci_project"
FEW = ["future_leak", "fully_masked_rows", "padding"]

TESTS = f'''
import pytest
import torch

import tiny_lm

BUILT = []
FEW = {FEW!r}


def build(*args, **kw):
    BUILT.append(args or kw.get("fill"))
    return tiny_lm.build(*args, **kw)


@pytest.mark.attention_doctor
def test_healthy():
    return build(fill="min")


@pytest.mark.attention_doctor(checks=FEW)
def test_planted():
    return build("sees_next", fill="min")


@pytest.mark.attention_doctor(baseline="nan_gradients.json", checks=FEW)
def test_expected():
    return build()


@pytest.mark.attention_doctor(baseline="nan_outputs.json", checks=FEW)
def test_other_cause():
    return build()


@pytest.mark.attention_doctor(baseline="nan_gradients.json", checks=FEW)
def test_fixed():
    return build(fill="min")


@pytest.mark.attention_doctor("tiny_lm.model:build", checks=["future_leak"])
def test_named():
    pass


@pytest.mark.attention_doctor(checks=["future_leak"], dtpye="float64")
def test_typo():
    return build(fill="min")


@pytest.mark.attention_doctor(baseline="missing.json", checks=["future_leak"])
def test_no_baseline_file():
    return build(fill="min")


@pytest.fixture(scope="module")
def shared():
    torch.manual_seed(1)
    m = tiny_lm.TinyLM(fill="min").double().train()
    m.register_buffer("steps", torch.tensor([3.0, 4.0], dtype=torch.float64))
    return m, {{k: v.clone() for k, v in m.state_dict().items()}}


@pytest.mark.attention_doctor(checks=["eval_dropout", "future_leak"])
def test_shared(shared):
    return shared[0]


def test_zz_each_model_built_once_and_the_shared_one_left_as_it_was(shared):
    assert BUILT == ["min", ("sees_next",), None, None, "min", "min", "min"], BUILT
    m, before = shared
    assert m.training and all(x.training for x in m.modules())
    after = m.state_dict()
    assert list(after) == list(before)
    for k, v in before.items():
        assert after[k].dtype == torch.float64 and torch.equal(after[k], v), k
'''

NAN_GRADIENTS = {"expected": [{"check": "fully_masked_rows", "cause": "nonfinite_gradients",
                               "reason": "-inf fills: a pad query's gradients are NaN", "thread": "pytorch/pytorch#41508"}]}
NAN_OUTPUTS = {"expected": [{"check": "fully_masked_rows", "cause": "nonfinite_outputs",
                             "reason": "-inf fills: a pad query's outputs are NaN"}]}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    p = tmp_path_factory.mktemp("maintainer")
    shutil.copytree(EXAMPLE / "tiny_lm", p / "tiny_lm")
    (p / "tests").mkdir()
    (p / "tests" / "test_ci.py").write_text(TESTS)
    (p / "tests" / "nan_gradients.json").write_text(json.dumps(NAN_GRADIENTS))
    (p / "tests" / "nan_outputs.json").write_text(json.dumps(NAN_OUTPUTS))
    return p


def _pytest(project, *args):
    """`pytest -v -rA` in the project with the plugin loaded: {test id: outcome word}, the output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(project)]), "OMP_NUM_THREADS": "1",
           "COLUMNS": "200"}   # the short summary line whole
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "attention_doctor.pytest_plugin", "-p", "no:xdist",
                        "-p", "no:cacheprovider", "-v", "-rA", *args], cwd=project, env=env, capture_output=True,
                       text=True, timeout=600)
    got = dict(re.findall(r"^tests/test_ci\.py::(\S+) (PASSED|FAILED|SKIPPED|XFAIL|XPASS|ERROR)", p.stdout, re.M))
    return got, p.stdout + p.stderr, p.returncode


@pytest.fixture(scope="module")
def run(project):
    return _pytest(project, "--attention-doctor-json", str(project / "results"))


def _failure(out, test_id):
    """The FAILURES section of one test."""
    start = out.index(f"_ {test_id} _")
    end = out.find("\n___", start + 1)
    return out[start:end if end > 0 else None]


def test_a_healthy_model_passes_each_check_as_its_own_test(run):
    from attention_doctor.checks import ORDER
    got, out, code = run
    healthy = {k[len("test_healthy["):-1]: v for k, v in got.items() if k.startswith("test_healthy[")}
    assert list(healthy) == list(ORDER), out
    assert set(healthy.values()) <= {"PASSED", "SKIPPED"} and healthy["future_leak"] == "PASSED", healthy
    assert healthy["kv_cache"] == "SKIPPED" and "n/a: no KV cache" in out   # n/a: skipped, saying why
    assert "AttentionDoctorWarning: padding: warn (positions_from_padding)" in out   # a warn passes, warning


def test_a_planted_bug_fails_with_its_check_as_the_test_id_and_its_cause(run):
    got, out, code = run
    assert got["test_planted[future_leak]"] == "FAILED" and code == 1, out
    assert got["test_planted[fully_masked_rows]"] == "PASSED" and got["test_planted[padding]"] == "PASSED"
    said = _failure(out, "test_planted[future_leak]")
    assert "future_leak: fail (outputs_move)" in said and re.search(r"^check +outcome +cause", said, re.M), said
    assert "FAILED tests/test_ci.py::test_planted[future_leak] - Failed: future_leak: fail (outputs_move)" in out


def test_a_baselined_fail_xfails_and_another_cause_fails(run):
    got, out, _ = run
    assert got["test_expected[fully_masked_rows]"] == "XFAIL", out
    assert "as the baseline expects: -inf fills: a pad query's gradients are NaN" in out
    assert got["test_other_cause[fully_masked_rows]"] == "FAILED"
    said = _failure(out, "test_other_cause[fully_masked_rows]")
    assert "fail (nonfinite_gradients)" in said and "the baseline expects fail (nonfinite_outputs)" in said, said


def test_a_baselined_fail_that_now_passes_is_reported_and_fails_under_strict(run, project):
    got, out, _ = run
    assert got["test_fixed[fully_masked_rows]"] == "XPASS", out
    assert "attention doctor: expected by the baseline, did not happen" in out
    assert "tests/test_ci.py::test_fixed[fully_masked_rows]: fully_masked_rows: pass; the baseline expects" in out
    strict, out2, code2 = _pytest(project, "-k", "test_fixed", "--attention-doctor-strict")
    assert strict["test_fixed[fully_masked_rows]"] == "FAILED" and "XPASS(strict)" in out2 and code2 == 1, out2
    assert strict["test_fixed[future_leak]"] == "PASSED"


def test_a_bad_marker_keyword_or_baseline_fails_its_tests_in_one_line(run):
    got, out, _ = run
    assert got["test_typo[future_leak]"] == got["test_no_baseline_file[future_leak]"] == "FAILED", out
    typo = _failure(out, "test_typo[future_leak]")
    assert "unexpected keyword argument 'dtpye'" in typo and "Traceback" not in typo, typo
    assert "baseline " in _failure(out, "test_no_baseline_file[future_leak]") and "cannot be read" in out


def test_a_named_target_a_shared_model_and_one_examination_per_model(run, project):
    got, out, _ = run
    assert got["test_named[future_leak]"] == "PASSED", out
    assert got["test_shared[eval_dropout]"] == got["test_shared[future_leak]"] == "PASSED", out
    assert got["test_zz_each_model_built_once_and_the_shared_one_left_as_it_was"] == "PASSED", out
    kept = sorted(f.name for f in (project / "results").iterdir())
    assert kept == sorted(f"tests_test_ci.py_test_{t}.json" for t in (
        "healthy", "planted", "expected", "other_cause", "fixed", "named", "shared")), kept
    r = json.loads((project / "results" / "tests_test_ci.py_test_expected.json").read_text())
    assert r["baseline"]["judged"]["fully_masked_rows"] == "expected" and r["exit_code"] == 0


def test_the_plugin_is_the_packages_pytest11_entry_point_and_it_and_the_ci_modules_load_without_torch():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["pytest11"] == {"attention_doctor": "attention_doctor.pytest_plugin"}
    p = subprocess.run([sys.executable, "-c", "import sys, attention_doctor.pytest_plugin as p; "
                        "import attention_doctor.baseline, attention_doctor.compare, attention_doctor.formats; "
                        "assert p.pytest_pyfunc_call; print('torch' in sys.modules)"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.stdout.strip() == "False", p.stdout + p.stderr
