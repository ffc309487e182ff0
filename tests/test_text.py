"""Char-level Shakespeare: the corpus, the split, determinism, the presets, the error path."""
import pytest
import torch

from conftest import SHAKESPEARE
from data import build_task
from data import text as text_mod

needs_corpus = pytest.mark.skipif(not SHAKESPEARE.is_file(), reason=f"no corpus at {SHAKESPEARE}")


@needs_corpus
def test_corpus_vocab_split_and_windows():
    t = build_task({"name": "shakespeare_char", "path": str(SHAKESPEARE), "seq_len": 64}, seed=0)
    assert t.vocab_size == 65 and t.input_len == 64
    n = len(SHAKESPEARE.read_text(encoding="utf-8"))
    assert len(t.splits["train"]) == int(0.9 * n) and len(t.splits["train"]) + len(t.splits["val"]) == n
    b = t.batch(3, 12, "train")
    assert b.x.shape == b.y.shape == (12, 64)
    assert torch.equal(b.x[:, 1:], b.y[:, :-1])  # y is x shifted by one character
    assert t.decode(t.encode("To be, or not")) == "To be, or not"
    # every window is a real substring of its split
    train = t.splits["train"]
    first = b.x[0, :8]
    hits = (train.unfold(0, 8, 1) == first).all(1)
    assert hits.any()


@needs_corpus
def test_batches_are_a_pure_function_of_seed_split_step():
    cfg = {"name": "shakespeare_char", "path": str(SHAKESPEARE), "seq_len": 16}
    a, b = build_task(cfg, seed=1), build_task(cfg, seed=1)
    assert torch.equal(a.batch(5, 4).x, b.batch(5, 4).x)
    assert not torch.equal(a.batch(5, 4).x, a.batch(6, 4).x)
    assert not torch.equal(a.batch(5, 4).x, a.batch(5, 4, "val").x)
    assert not torch.equal(a.batch(5, 4).x, build_task(cfg, seed=2).batch(5, 4).x)


@needs_corpus
def test_vocab_size_mismatch_is_one_line_error():
    with pytest.raises(ValueError, match=r"data.vocab_size=64 .* 65 distinct"):
        build_task({"name": "shakespeare_char", "path": str(SHAKESPEARE), "vocab_size": 64}, seed=0)


def test_missing_file_and_no_network_is_one_line_error(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="data.path=.* is not a file"):
        text_mod.corpus_path(str(tmp_path / "nope.txt"))
    monkeypatch.setattr(text_mod, "CACHE", tmp_path / "cache" / "t.txt")
    monkeypatch.setattr(text_mod, "SHARED", tmp_path / "shared.txt")
    # an unreachable URL stands in for "no network": the error names the fix
    with pytest.raises(ValueError, match="download from .* failed .*data.path=") as e:
        text_mod.corpus_path(None, url="http://127.0.0.1:9/input.txt")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "cache" / "t.txt").exists()


def test_download_writes_the_cache_once(tmp_path, monkeypatch):
    src = tmp_path / "served.txt"
    src.write_text("hello world\n" * 50)
    dest = tmp_path / "cache" / "t.txt"
    monkeypatch.setattr(text_mod, "CACHE", dest)
    monkeypatch.setattr(text_mod, "SHARED", tmp_path / "absent.txt")
    assert text_mod.corpus_path(None, url=src.as_uri()) == dest
    assert dest.read_text() == src.read_text()
    src.unlink()  # the second call reads the cache, not the URL
    assert text_mod.corpus_path(None, url=src.as_uri()) == dest


@needs_corpus
def test_nanogpt_presets_compose_and_build(compose_cfg):
    from experiments.training.loop import Trainer
    cfg = compose_cfg(["data=shakespeare_char", f"data.path={SHAKESPEARE}", "model=nanogpt_cpu",
                       "optim=nanogpt_cpu", "train=nanogpt_cpu", "logger=none"])
    assert (cfg["model"]["n_layers"], cfg["model"]["n_heads"], cfg["model"]["d_model"]) == (4, 4, 128)
    assert (cfg["train"]["batch_size"], cfg["train"]["steps"], cfg["model"]["block_size"]) == (12, 2000, 64)
    assert cfg["optim"]["betas"] == [0.9, 0.99] and cfg["optim"]["min_lr"] == 1e-4
    tr = Trainer(cfg, run_dir="unused")
    assert tr.model.cfg.vocab_size == 65 and not tr.model.cfg.bias
    # nanoGPT's schedule: warmup (it+1)/(warmup+1), cosine to min_lr at 2000
    lrs = [tr.sched.lr_lambdas[0](s) * 1e-3 for s in (0, 99, 100, 1050, 2000)]
    assert lrs[0] == pytest.approx(1e-3 / 101) and lrs[1] == pytest.approx(1e-3 * 100 / 101)
    assert lrs[2] == pytest.approx(1e-3) and lrs[3] == pytest.approx(5.5e-4) and lrs[4] == pytest.approx(1e-4)
