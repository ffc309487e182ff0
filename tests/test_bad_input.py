"""Bad input ends with one line on stderr naming the field, exit code 2, and no run recorded as
completed. Every case runs run.py as __main__, one after another in ONE new Python process (torch
and Hydra imported once: seconds for all of them; never a fork of the test process, see
tests/test_processes.py), and one case runs through a plain `python run.py` as well."""
import io
import json
import runpy
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch

from conftest import ROOT, TINY, run_py


def run_cases(cases: dict[str, list[str]]) -> dict[str, tuple[int, str]]:
    """{name: run.py's argv} -> {name: (exit code, stderr)}, each run as `python run.py ARGS`
    would run, in one new process (serve_cases)."""
    code = "import sys; sys.path.insert(0, 'tests'); from test_bad_input import serve_cases; serve_cases()"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, input=json.dumps(cases), capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return {name: tuple(v) for name, v in json.loads(p.stdout.splitlines()[-1]).items()}


def serve_cases():
    """In the child: each case's run.py as __main__, its stderr and exit code; JSON on stdout."""
    from hydra.core.global_hydra import GlobalHydra
    out, stdout = {}, sys.stdout
    for name, args in json.load(sys.stdin).items():
        GlobalHydra.instance().clear()  # as in a new process
        sys.argv, err, code = ["run.py", *args], io.StringIO(), 0
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            try:
                runpy.run_path(str(ROOT / "run.py"), run_name="__main__")
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException as e:  # noqa: BLE001
                code, _ = 70, print(f"uncaught: {e!r}", file=sys.stderr)
        out[name] = (code, err.getvalue())
    print(json.dumps(out), file=stdout, flush=True)


def assert_rejected(result: tuple[int, str], results: Path, must_name: str) -> str:
    """(exit code, stderr) of a run.py rejected with one line naming `must_name`, that left no run
    dir under `results`; returns the line."""
    code, err = result
    lines = [l for l in err.splitlines() if l.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert must_name in lines[0], lines[0]
    # nothing recorded: no summary, and no run dir at all (Hydra's own is removed)
    assert not (Path(results) / "runs").exists()
    return lines[0]


CASES = {
    "d_model_not_divisible_by_n_heads": (["model.d_model=33"], "error: model.d_model=33 is not divisible by "
                                         "model.n_heads=2 (or set model.attention.d_k)"),
    "n_heads_not_divisible_by_n_kv_heads": (["model.n_heads=2", "model.n_kv_heads=3"], "model.n_kv_heads=3"),
    "d_k_zero": (["model.attention.d_k=0"], "attention.d_k=0"),
    "d_k_negative": (["model.attention.d_k=-8"], "attention.d_k=-8"),
    "unknown_exp": (["+exp=no_such_experiment"], "no_such_experiment"),
    "unknown_softmax": (["model.attention.softmax=softish"], "attention.softmax='softish'"),
    "unknown_score": (["model.attention.score=cosinus"], "attention.score='cosinus'"),
    "unknown_backend": (["model.attention.backend=flash9"], "attention.backend='flash9'"),
    "unknown_init": (["model.init=xavier9"], "model.init='xavier9'"),
    "unknown_mask_mode": (["model.attention.mask_mode=sideways"], "attention.mask_mode='sideways'"),
    "zero_lr": (["optim.lr=0"], "optim.lr=0"),
    "negative_lr": (["optim.lr=-0.001"], "optim.lr=-0.001"),
    "seq_len_above_block_size": (["model.block_size=8"], "model.block_size=8"),
    # the rows of the issue that used to train, crash or judge vacuously
    "dtype_float8": (["train.dtype=float8"], "train.dtype='float8' is not allowed: one of auto, float32, bfloat16, float16"),
    "batch_size_zero": (["train.batch_size=0"], "train.batch_size=0 is not allowed: an integer >= 1"),
    "steps_zero": (["train.steps=0"], "train.steps=0 is not allowed: an integer >= 1"),
    "vocab_of_one": (["data.vocab_size=1"], "data.vocab_size=1 is not allowed: an integer >= 2"),
    "diag_every_negative": (["train.diag_every=-5"], "train.diag_every=-5 is not allowed: an integer >= 0"),
    "eval_batches_negative": (["train.eval_batches=-1"], "train.eval_batches=-1 is not allowed: an integer >= 1"),
    "threads_zero": (["train.threads=0"], "train.threads=0 is not allowed: one of auto or an integer >= 1 or null"),
    # one per class of check: type, range, choice, cross-field
    "type": (["seed=abc"], "seed='abc' is not allowed: an integer >= 0"),
    "type_bool": (["model.bias=maybe"], "model.bias='maybe' is not allowed: true or false"),
    "range_nan": (["optim.lr=nan"], "optim.lr=nan is not allowed: a number > 0"),
    "range_open": (["model.attention.dropout=1.0"], "model.attention.dropout=1 is not allowed: a number in [0, 1)"),
    "choice_or_number": (["model.attention.scale=-2"], "model.attention.scale=-2 is not allowed: one of sqrt_dk, none, learned or a number > 0"),
    "choice_of_task_key": (["data=two_facts", "data.n_values=1"], "data.n_values=1 is not allowed: an integer >= 2"),
    "cross_kv_heads": (["model.n_heads=4", "model.n_kv_heads=3"], "model.n_kv_heads=3 does not divide model.n_heads=4"),
    "cross_min_lr": (["optim.min_lr=0.5"], "optim.min_lr=0.5 is above optim.lr=0.001"),
    "cross_copy_length": (["data.seq_len=2", "model.block_size=2"], "data.seq_len=2 is not allowed for the copy task"),
    "cross_backend": (["model.attention.backend=sdpa", "model.attention.softmax=naive"], "backend='sdpa' cannot express"),
    # issue 23: a key nobody reads, added or overridden; a misspelt experiment or check (more in test_schema.py)
    "unknown_key_added": (["+train.step=100"], "error: train.step is not a config key (did you mean train.steps?)"),
    "unknown_key": (["train.step=100"], "error: train.step is not a config key (did you mean train.steps?)"),
    "exp_typo": (["+exp=no_scalng"], "error: unknown exp 'no_scalng': did you mean no_scaling?"),
    "added_twice": (["+train.steps=5"], "error: train.steps is already in the config: set it without the + (train.steps=...)"),
    "check_typo": (["+exp=no_scaling", "exp.checks.platau.value=30"],
                   "exp.checks.platau.value is not a config key (did you mean exp.checks.plateau.value?)"),
}


CASES.update({
    "multirun_unknown_key": (["-m", "train.step=1,2"], "error: train.step is not a config key (did you mean train.steps?)"),
    "text_data_path_missing": (["data=shakespeare_char", "data.path=/nonexistent/no_such_corpus.txt", "data.seq_len=16"],
                               "data.path"),
    "results_dir_unwritable": ([], "results_dir"),
})
if not torch.cuda.is_available():
    CASES["cuda_without_a_gpu"] = (["device=cuda"], "device='cuda' but no CUDA device is available")


def results_for(tmp: Path, name: str) -> Path:
    return tmp / "a_file" / "results" if name == "results_dir_unwritable" else tmp / name / "results"


@pytest.fixture(scope="module")
def rejected(tmp_path_factory):
    """(tmp dir, {case: (exit code, stderr)}) of every case, run once."""
    tmp = tmp_path_factory.mktemp("bad_input")
    (tmp / "a_file").write_text("not a directory")  # root ignores permission bits; a file in the path does not
    return tmp, run_cases({name: [*(a for a in args if a.startswith("-")), *TINY,  # -m first, as typed
                                  *(a for a in args if not a.startswith("-")), f"results_dir={results_for(tmp, name)}"]
                           for name, (args, _) in CASES.items()})


@pytest.mark.parametrize("name", list(CASES))
def test_bad_config_exits_2_with_one_line(name, rejected):
    tmp, results = rejected
    line = assert_rejected(results[name], results_for(tmp, name), CASES[name][1])
    if name == "results_dir_unwritable":
        assert "cannot be written" in line
    if name == "multirun_unknown_key":
        assert line == CASES[name][1] and not (results_for(tmp, name) / "multirun").exists()


def test_bad_input_through_the_real_command_line(tmp_path):
    p = run_py([*TINY, "model.d_model=33", f"results_dir={tmp_path}"])
    assert_rejected((p.returncode, p.stderr), tmp_path, CASES["d_model_not_divisible_by_n_heads"][1])
