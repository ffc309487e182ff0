"""Text versions (experiments/on_text.py): one composition applies the text version on text and
not on copy, and the run dir's .hydra/config.yaml is the config that trained; an experiment without
one is rejected in one line, a metric the task never logs is "not measurable", and
attention.reach=self (the no-attention floor) reads nothing but its own position."""
import json
from pathlib import Path

import pytest
import torch

from attention.mha import AttentionConfig, MultiHeadAttention
from conftest import ROOT, SHAKESPEARE
from experiments.judging.checks import signature
from experiments.judging.verdict import RunView, evaluate
from test_bad_input import assert_rejected, run_forked

needs_corpus = pytest.mark.skipif(not SHAKESPEARE.is_file(), reason=f"no corpus at {SHAKESPEARE}")


@needs_corpus
def test_overlay_applies_on_text_only_and_the_command_line_wins(compose_cfg):
    text = compose_cfg(["+exp=no_scaling", "data=shakespeare_char", f"data.path={SHAKESPEARE}",
                        "train.steps=123", "++exp.checks.floor_plateau.value=7"])
    assert "floor_plateau" in text["exp"]["expect"] and "plateau" not in text["exp"]["expect"]
    assert text["exp"]["floor"]["overrides"] == {"model.attention.reach": "self"}
    assert text["train"]["steps"] == 123 and text["exp"]["checks"]["floor_plateau"]["value"] == 7
    assert text["model"]["attention"]["scale"] == "none"  # the experiment itself still applies
    copy = compose_cfg(["+exp=no_scaling"])
    assert "plateau" in copy["exp"]["expect"] and copy["exp"]["floor"] is None


def trained_and_recorded(tmp_path, args):
    """(the config that trained, as summary.json has it; the run dir's .hydra/config.yaml, resolved)."""
    from omegaconf import OmegaConf
    from conftest import TINY
    tiny = [a for a in TINY if not a.startswith("data.vocab_size")] if "data=shakespeare_char" in args else TINY
    code, err = run_forked([*tiny, *args, f"results_dir={tmp_path}"], tmp_path)
    assert code == 0, err
    (run_dir,) = [p.parent for p in (tmp_path / "runs").rglob("summary.json")]
    recorded = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml"), resolve=True)
    return json.loads((run_dir / "summary.json").read_text())["config"], recorded


@needs_corpus
def test_the_run_dir_records_exactly_the_config_that_trained_on_text(tmp_path):
    trained, recorded = trained_and_recorded(tmp_path, ["+exp=sum_normalize", "data=shakespeare_char",
                                                        f"data.path={SHAKESPEARE}", "train.diag_every=0"])
    assert trained == recorded
    assert trained["exp"]["expect"] == ["negative_weights", "outside_hull", "worse_than_softmax"]  # the text version's
    assert trained["exp"]["floor"]["name"] == "no_attention_floor" and trained["exp"]["loss_metric"] == "loss/train"
    # on copy: tests/test_run.py::test_tiny_run_writes_metrics_summary_figure_and_offline_wandb


@needs_corpus
def test_an_experiment_without_a_text_version_exits_2_in_one_line(tmp_path):
    line = assert_rejected(["+exp=causal_kv_cache", "data=shakespeare_char", f"data.path={SHAKESPEARE}"],
                           tmp_path, "causal_kv_cache has no text version")
    assert "data=copy" in line


def test_a_metric_the_task_never_logs_is_not_measurable_not_a_fail():
    exp = {"expect": ["copy", "low"], "checks": {
        "copy": {"kind": "threshold", "metric": "loss/copy", "op": "<=", "value": 0.1},
        "low": {"kind": "threshold", "metric": "loss/train", "op": "<=", "value": 2.0}}}
    run = RunView("completed", rows=[{"step": 0, "loss/train": 4.2}], final={"loss/train": 1.9})
    ctrl = RunView("completed", rows=[{"step": 0, "loss/train": 4.2}], final={"loss/train": 2.5})
    v = evaluate(signature(exp), run, ctrl)
    copy, low = v["checks"]
    assert copy["not_measurable"] and copy["report_only"] and copy["expected"] == "not measurable on this data"
    assert low["passed"] and not low.get("not_measurable")
    assert v["not_measurable"] == ["copy"] and v["reproduced"]
    # a metric the control logged but the failure did not is a FAIL, as before
    ctrl.rows[0]["loss/copy"] = 0.05
    v = evaluate(signature(exp), run, ctrl)
    assert not v["checks"][0].get("not_measurable") and not v["reproduced"]


@pytest.mark.parametrize("backend", ["explicit", "sdpa"])
def test_reach_self_reads_only_its_own_position(backend):
    torch.manual_seed(0)
    attn = MultiHeadAttention(AttentionConfig(d_model=16, n_heads=2, reach="self", backend=backend))
    x = torch.randn(2, 7, 16)
    y = x.clone()
    y[:, 3] += 1.0  # change one position: only its own output may move
    out_x, _ = attn(x, x, x, is_causal=True)
    out_y, _ = attn(y, y, y, is_causal=True)
    moved = (out_x - out_y).abs().amax(dim=(0, 2)) > 1e-6
    assert moved.tolist() == [i == 3 for i in range(7)]
    # and it is W_o W_v x: attention over one key is the identity
    assert torch.allclose(out_x, attn.W_o(attn.W_v(x)), atol=1e-5)
    full = MultiHeadAttention(AttentionConfig(d_model=16, n_heads=2, backend=backend))
    full.load_state_dict(attn.state_dict())
    assert ((full(x, x, x, is_causal=True)[0] - full(y, y, y, is_causal=True)[0]).abs().amax(dim=(0, 2))
            > 1e-6)[4:].all()  # with reach=all, later positions read position 3


@needs_corpus
def test_a_text_run_trains_its_floor_once_and_the_report_puts_it_beside_the_synthetic_verdict(
        compose_cfg, tmp_path):
    from experiments.report.build import build
    from experiments.training.runner import run_experiment
    tiny = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "data.seq_len=16", "train.steps=4",
            "train.batch_size=4", "train.log_every=2", "train.diag_every=0", "train.eval_batches=1",
            "logger=none", "train.progress=false"]
    cfg = compose_cfg(["+exp=sum_normalize", "data=shakespeare_char", f"data.path={SHAKESPEARE}", *tiny],
                      results_dir=tmp_path)
    rec = run_experiment(cfg, tmp_path / "runs" / "sum_normalize" / "a")
    floor_dir = Path(rec.floor["dir"])
    assert floor_dir.parent.name == "controls" and floor_dir.name == rec.floor["config_hash"]
    assert rec.context["floor"] == rec.floor["final"]["loss/train"]
    floor = json.loads((floor_dir / "summary.json").read_text())
    assert floor["config"]["model"]["attention"]["reach"] == "self"
    assert floor["config"]["model"]["attention"]["softmax"] == "stable"  # the control's model, not the bug
    mtime = (floor_dir / "summary.json").stat().st_mtime_ns
    run_experiment(cfg, tmp_path / "runs" / "sum_normalize" / "b")  # the floor is cached, not retrained
    assert (floor_dir / "summary.json").stat().st_mtime_ns == mtime
    synth = compose_cfg(["+exp=sum_normalize", *tiny, "data.vocab_size=8"], results_dir=tmp_path)
    run_experiment(synth, tmp_path / "runs" / "sum_normalize" / "c")
    report = build([tmp_path], tmp_path / "report").read_text()
    text = report.split("## Synthetic task and text side by side")[1]
    row = next(line for line in text.splitlines() if line.startswith("| sum_normalize |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1].endswith("(n < 3)") and cells[2].endswith("(n < 3)")  # one synthetic, one text variant each
    want = rec.final["loss/train"] - rec.control["final"]["loss/train"]
    assert cells[3] == f"{want:+.2f}"
    assert (tmp_path / "report" / "figures" / "text_floor.png").exists()
    assert "| baseline | – | – | – | – | text version not run |" in text
    # the synthetic catalogue does not mix in the text runs
    catalogue = report.split("## Catalogue")[1].split("\n## ")[0]
    assert catalogue.count("sum_normalize") >= 1 and "shakespeare" not in catalogue


def test_a_skipped_text_cell_is_not_a_crash_of_the_sweep(tmp_path, capsys):
    from experiments.callbacks import crashed_jobs, finish_multirun
    from experiments.layout import REJECTED, SKIPPED
    for name, marker in (("0_causal_kv_cache_seed0", SKIPPED), ("1_bad_seed0", REJECTED)):
        (tmp_path / name / ".hydra").mkdir(parents=True)
        (tmp_path / name / marker).write_text("the one line\n")
    assert [d.name for d, _ in crashed_jobs(tmp_path)] == ["1_bad_seed0"]
    (tmp_path / "1_bad_seed0" / REJECTED).unlink()
    (tmp_path / "1_bad_seed0" / SKIPPED).write_text("x\n")
    assert finish_multirun(tmp_path) == 0
    assert "skipped: 0_causal_kv_cache_seed0: the one line" in capsys.readouterr().out


def test_every_text_version_plots_the_text_loss_and_pairs_the_heatmaps_by_layer(compose_cfg):
    """Issue 23: five text versions plotted loss/copy (never logged on text: an empty panel), and
    the heatmaps put the failure's layer 0 beside the control's layer 1."""
    import numpy as np
    from experiments.report.figures import shown_heads
    for f in sorted((ROOT / "conf" / "on_text").glob("*.yaml")):
        data = "shakespeare_lines" if "shakespeare_lines" in f.read_text() else "shakespeare_char"
        cfg = compose_cfg([f"+exp={f.stem}", f"data={data}"])
        assert cfg["exp"]["loss_metric"] == "loss/train", f.stem  # text batches have no loss groups
    sharp, flat = np.eye(4)[None], np.full((1, 4, 4), 0.25)
    failure = {0: {"L0": flat, "L1": sharp}}   # its most focused head: L1 H0
    control = {0: {"L0": sharp, "L1": flat}}   # its own would be L0 H0
    assert shown_heads([failure, control]) == [("L1", 0), ("L1", 0)]
    assert shown_heads([failure, {0: {"L0": sharp}}]) == [("L1", 0), ("L0", 0)]  # no L1: its own
