"""Bad input ends with one line on stderr naming the field, exit code 2, and no run recorded as
completed. Each case runs `run.py` as __main__ in its own process; the processes are forked
from this one after torch and Hydra are imported (seconds per case otherwise), and one case
runs through a plain `python run.py` to check the real command line as well."""
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, TINY

import torch  # imported once here, shared by the forked cases
import hydra  # noqa: F401


def run_forked(args: list[str], tmp_path: Path) -> tuple[int, str]:
    """`python run.py ARGS` in a forked child; returns (exit code, stderr)."""
    err = tmp_path / "stderr.txt"
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 2)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            sys.stderr = open(2, "w", closefd=False)
            sys.stdout = open(1, "w", closefd=False)
            os.chdir(ROOT)
            sys.argv = ["run.py", *args]
            runpy.run_path(str(ROOT / "run.py"), run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException as e:  # noqa: BLE001
            print(f"uncaught: {e!r}", file=sys.stderr)
        finally:
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), err.read_text()


def assert_rejected(args, tmp_path, must_name, results=None):
    results = results or tmp_path / "results"
    code, err = run_forked([*TINY, *args, f"results_dir={results}"], tmp_path)
    lines = [l for l in err.splitlines() if l.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert must_name in lines[0], lines[0]
    # nothing recorded: no summary, and no run dir at all (Hydra's own is removed)
    assert not (Path(results) / "runs").exists()
    return lines[0]


CASES = {
    "d_model_not_divisible_by_n_heads": (["model.d_model=33"], "model.d_model=33"),
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
    "check_typo": (["+exp=no_scaling", "exp.checks.platau.value=30"],
                   "exp.checks.platau.value is not a config key (did you mean exp.checks.plateau.value?)"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_config_exits_2_with_one_line(name, tmp_path):
    args, must_name = CASES[name]
    assert_rejected(args, tmp_path, must_name)


def test_an_unknown_key_in_a_multirun_exits_2_and_leaves_no_sweep_dir(tmp_path):
    code, err = run_forked(["-m", *TINY, "train.step=1,2", f"results_dir={tmp_path / 'results'}"], tmp_path)
    assert code == 2 and err.strip() == "error: train.step is not a config key (did you mean train.steps?)", err
    assert not (tmp_path / "results" / "multirun").exists()


def test_cuda_without_a_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert_rejected(["device=cuda"], tmp_path, "device='cuda' but no CUDA device is available")


def test_text_data_path_that_does_not_exist(tmp_path):
    if not (ROOT / "conf" / "data" / "shakespeare_char.yaml").exists():
        pytest.skip("no text data config")
    missing = tmp_path / "no_such_corpus.txt"
    assert_rejected(["data=shakespeare_char", f"data.path={missing}", "data.seq_len=16"], tmp_path,
                    "data.path")


def test_results_dir_that_cannot_be_written(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")  # root ignores permission bits; a file in the path does not
    line = assert_rejected([], tmp_path, "results_dir", results=blocker / "results")
    assert "cannot be written" in line


def test_bad_input_through_the_real_command_line(tmp_path):
    p = subprocess.run([sys.executable, "run.py", *TINY, "model.d_model=33", f"results_dir={tmp_path}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 2, p.stderr
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert lines == ["error: model.d_model=33 is not divisible by model.n_heads=2 (or set model.attention.d_k)"]
    assert not (tmp_path / "runs").exists()

