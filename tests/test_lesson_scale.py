"""The lesson at its scale (`-m +exp=lesson_scale`): the byte-pair vocabulary, the preset, the
sentence's verdict per cell, and its report section, all on tiny versions."""
import math
import re

import pytest
import torch

from data.bpe import BpeText, load_bpe, train_bpe
from data.text import python_source_text
from experiments.judging import lesson

LN_V = math.log(32768)


def test_bpe_is_deterministic_and_says_how_many_tokens_a_corpus_yields(tmp_path):
    text = python_source_text()[:4000]
    a, b = train_bpe([text], 300), train_bpe([text], 300)
    assert a.get_vocab_size() == 300 and a.to_str() == b.to_str()   # the same merges every time
    assert a.decode(a.encode(text).ids) == text                      # byte level: nothing lost
    with pytest.raises(ValueError, match=r"data.vocab_size=20000: these corpora yield only \d+ byte-pair tokens"):
        train_bpe([text[:500]], 20000)
    tok, digest, ids = load_bpe(("python_source",), 300, 4000, tmp_path)
    assert (tmp_path / "bpe_300_python_source-4000.json").is_file() and len(digest) == 64
    assert tok.to_str() == a.to_str() and int(ids[0].max()) < 300


def test_bpe_task_windows_per_corpus_split():
    task = BpeText(vocab_size=300, seq_len=16, corpora=["python_source"], max_chars=6000, seed=1)
    b = task.batch(3, 4)
    assert b.x.shape == b.y.shape == (4, 16) and torch.equal(b.x[:, 1:], b.y[:, :-1])
    assert int(b.x.max()) < 300 and torch.equal(task.batch(3, 4).x, b.x)   # a pure function of the step
    n = len(task.splits["train"]) + len(task.splits["val"])
    assert abs(len(task.splits["train"]) / n - 0.9) < 0.01
    with pytest.raises(ValueError, match="data.corpora: no corpus 'novels'"):
        BpeText(vocab_size=300, corpora=["novels"])


def test_the_preset_composes_the_lesson_s_model_and_its_grid():
    from experiments.config import compose_config
    cfg = compose_config(["+exp=lesson_scale"], return_hydra_config=True)
    assert cfg.data.name == "bpe_text" and cfg.data.vocab_size == 32768
    assert (cfg.model.d_model, cfg.model.n_heads, cfg.model.attention.d_k) == (512, 8, None)   # d_k = 64
    grid = cfg.hydra.sweeper.params
    assert grid["model.attention.scale"] == "none,sqrt_dk" and grid["optim"] == "adamw,sgd"
    assert grid["model.init"] == "gpt2,unit_variance,torch_default"


def curve(l0, l50, end, steps=200, nan_at=None):
    """A logged train loss every 10 steps: l0 at 0, a straight line to l50 at 50, then to `end`."""
    out = []
    for s in range(0, steps, 10):
        v = l0 + (l50 - l0) * s / 50 if s <= 50 else l50 + (end - l50) * (s - 50) / (steps - 60)
        out.append((s, math.nan if nan_at is not None and s >= nan_at else v))
    return out


def test_the_sentence_held():
    v = lesson.judge(curve(LN_V, 9.8, 9.75), LN_V, 200)
    assert v.held and v.shape and v.plateau_capped and v.plateau_steps == 150
    assert v.start.measured == pytest.approx(LN_V) and v.at_50.measured == pytest.approx(9.8, abs=0.02)
    assert v.plateau_level == pytest.approx(9.78, abs=0.03)


@pytest.mark.parametrize("l0,l50,end,failed,shape", [
    (14.0, 9.8, 9.8, {"start"}, False),          # large logits at init: not at ln V
    (LN_V, 7.5, 7.45, {"at 50"}, True),          # the unigram learned at once, then flat: the shape only
    (LN_V, 10.35, 10.3, {"at 50"}, True),        # nothing moves in 50 steps
    (LN_V, 9.8, 6.0, {"flat"}, False),           # it learns after step 50
])
def test_the_sentence_refuted_per_clause(l0, l50, end, failed, shape):
    v = lesson.judge(curve(l0, l50, end), LN_V, 200)
    assert not v.held and v.shape is shape
    assert {c.name for c in (v.start, v.at_50, v.flat) if not c.held} == failed
    if "flat" in failed:
        assert not v.plateau_capped and 0 < v.plateau_steps < 150


def test_a_diverged_run_refutes_the_sentence():
    v = lesson.judge(curve(LN_V, 9.8, 9.8, nan_at=120), LN_V, 200)
    assert v.diverged_at == 120 and not v.held and not v.flat.held and v.plateau_steps == 70


def test_a_tiny_cell_trains_and_its_section_renders(compose_cfg, tmp_path):
    """Two tiny cells (scaled, unscaled) through the runner; the section judges them and renders."""
    from experiments.records import RunRecord
    from experiments.report.sections import lesson_scale
    from experiments.training.runner import run_experiment
    tiny = ["data.vocab_size=300", "data.corpora=[python_source]", "data.max_chars=20000", "data.seq_len=16",
            "model.d_model=32", "model.n_heads=2", "train.steps=60", "train.batch_size=4", "train.diag_every=50",
            "train.eval_batches=1", "logger=none", "train.progress=false", "train.threads=1"]
    runs = []
    for scale in ("sqrt_dk", "none"):
        cfg = compose_cfg(["+exp=lesson_scale", *tiny, f"model.attention.scale={scale}"], tmp_path)
        runs.append(run_experiment(cfg, tmp_path / scale))
    rows = RunRecord.read(tmp_path / "none").metrics()
    assert rows[0]["step"] == 0 and abs(rows[0]["loss/train"] - math.log(300)) < 0.25   # GPT-2 init: chance
    assert 0 <= rows[0]["attn/saturated/L0"] <= 1 and rows[0]["grad/scores/L0"] > 0
    blocks = lesson_scale.blocks([RunRecord.read(tmp_path / s) for s in ("sqrt_dk", "none")], tmp_path / "figures")
    assert blocks[lesson_scale.NAME].startswith(lesson_scale.TITLE)
    assert re.search(r"unscaled: \*\*[01] of 1\*\*.*; scaled: \*\*[01] of 1\*\*", blocks[lesson_scale.NAME])
    assert blocks[lesson_scale.NAME].count("| adamw | gpt2 |") == 1           # one row per pair of twins
    assert blocks["lesson_scale_cells"].count("| adamw | gpt2 |") == 2
    assert (tmp_path / "figures" / lesson_scale.FIGURE).is_file()
