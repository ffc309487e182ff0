"""Text versions (experiments/on_text.py): one composition applies the text version on text and
not on copy, and the run dir's .hydra/config.yaml is the config that trained; an experiment without
one is rejected in one line, a metric the task never logs is "not measurable", and
attention.reach=self (the no-attention floor) reads nothing but its own position."""
import json
from pathlib import Path

import pytest
import torch

from attention.mha import AttentionConfig, MultiHeadAttention
from conftest import SHAKESPEARE, TINY, needs_corpus, run_py
from experiments.judging.checks import signature
from experiments.judging.verdict import RunView, evaluate
from test_bad_input import assert_rejected

LINES = ("fully_masked_rows", "left_padding_positions", "mask_broadcast", "mask_broadcast_shape_error",
         "mask_min_overflow")  # the padded-lines versions


@needs_corpus
def test_overlay_applies_on_text_only_and_the_command_line_wins(compose_cfg):
    text = compose_cfg(["+exp=no_scaling", "data=shakespeare_char", f"data.path={SHAKESPEARE}",
                        "train.steps=123", "++exp.checks.floor_plateau.value=7"])
    assert "floor_plateau" in text["exp"]["expect"] and "plateau" not in text["exp"]["expect"]
    assert text["exp"]["floor"]["overrides"]["model.attention.reach"] == "self"  # declared once, in conf/text/
    assert (text["model"]["n_heads"], text["model"]["attention"]["d_k"]) == (1, 256)  # its own heads, on the text model
    assert text["train"]["steps"] == 123 and text["exp"]["checks"]["floor_plateau"]["value"] == 7
    assert text["model"]["attention"]["scale"] == "none"  # the experiment itself still applies
    copy = compose_cfg(["+exp=no_scaling"])
    assert "plateau" in copy["exp"]["expect"] and copy["exp"]["floor"] is None


def trained_and_recorded(tmp_path, args):
    """(the config that trained, as summary.json has it; the run dir's .hydra/config.yaml, resolved;
    the run's stdout)."""
    from omegaconf import OmegaConf
    tiny = [a for a in TINY if not a.startswith("data.vocab_size")] if "data=shakespeare_char" in args else TINY
    p = run_py([*tiny, *args, f"results_dir={tmp_path}"])
    assert p.returncode == 0, p.stderr[-3000:]
    (run_dir,) = [p.parent for p in (tmp_path / "runs").rglob("summary.json")]
    recorded = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml"), resolve=True)
    return json.loads((run_dir / "summary.json").read_text())["config"], recorded, p.stdout


@needs_corpus
def test_the_run_dir_records_exactly_the_config_that_trained_on_text(tmp_path):
    trained, recorded, out = trained_and_recorded(tmp_path, ["+exp=sum_normalize", "data=shakespeare_char",
                                                             f"data.path={SHAKESPEARE}", "train.diag_every=0",
                                                             "optim=nanogpt_cpu"])
    assert trained == recorded
    # the text model replaced the optimizer chosen on the command line, and the run said so first
    assert trained["optim"]["lr"] == 6e-3 and trained["optim"]["betas"] == [0.9, 0.99]
    assert out.splitlines()[0].startswith("note: on text data the text model (conf/text_lm/char.yaml) replaced "
                                          "what optim=nanogpt_cpu set: optim.lr=0.001 -> 0.006, ")
    assert trained["exp"]["expect"] == ["negative_weights", "outside_hull", "loses_the_gain"]  # the text version's
    assert trained["exp"]["floor"]["name"] == "no_attention_floor" and trained["exp"]["loss_metric"] == "loss/train"
    # on copy: tests/test_run.py::test_tiny_run_writes_metrics_summary_figure_and_offline_wandb


def test_a_group_the_text_model_replaces_is_named_in_one_line_and_text_lm_none_keeps_it():
    from experiments.config import compose, replaced_by_text_model
    args = ["model=nanogpt_cpu", "data=python_source_char", "model.n_heads=8"]
    line = replaced_by_text_model(args, compose(args))
    assert line == ("note: on text data the text model (conf/text_lm/char.yaml) replaced what model=nanogpt_cpu "
                    "set: model.n_layers=4 -> 2; add text_lm=none to train your choice")  # n_heads: the command line's
    kept = [*args, "text_lm=none"]
    assert replaced_by_text_model(kept, compose(kept)) is None and compose(kept)["model"]["n_layers"] == 4
    copy = ["model=nanogpt_cpu"]  # no text model on the copy task: nothing replaced
    assert replaced_by_text_model(copy, compose(copy)) is None


def test_an_experiment_without_a_text_version_exits_2_in_one_line_saying_why(tmp_path):
    p = run_py([*TINY, "+exp=rank_collapse_depth", "model.residual=false", "model.n_layers=2",
                "data=python_source_char", f"results_dir={tmp_path}"])
    line = assert_rejected((p.returncode, p.stderr), tmp_path, "rank_collapse_depth has no text version")
    assert "data=copy" in line and "the depth sweep of rank_collapse" in line


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
    gain = rec.control["final"]["loss/train"] - rec.floor["final"]["loss/train"]
    assert cells[5] == f"{gain:+.2f}"  # control − floor: what attention buys the control
    assert (tmp_path / "report" / "figures" / "text_floor.png").exists()
    assert "| baseline | – | – | – | – | – | – | – | text version not run |" in text   # a column per other corpus
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


# -- every text version: the shared text model, one floor, one step on text --------------------

@pytest.fixture(scope="module")
def text_versions():
    """Every text version composed on its Python-source task (the corpus that needs no file):
    {name: config}; and the text model itself on lines."""
    from experiments.config import compose
    from experiments.on_text import CONF
    out = {}
    for p in sorted((CONF / "on_text").glob("*.yaml")):
        data = "python_source_lines" if p.stem in LINES else "python_source_char"
        out[p.stem] = compose([f"+exp={p.stem}", f"data={data}"])
    out["text model on lines"] = compose(["+exp=fully_masked_rows", "data=python_source_lines",  # its bug fixed
                                          "model.attention.mask_fill=finite", "model.attention.backend=auto"])
    return out


def test_every_text_version_is_judged_against_one_floor_and_most_share_one_control(text_versions):
    """The floor is the text model without attention, trained once per corpus and seed: every
    version's floor config is the same. A version whose control is the text model with its bug
    fixed trains no control of its own; the others say why in their overlay."""
    from experiments.records import config_hash
    from experiments.training.runner import control_config, floor_config
    own_control = {"additive_scores", "cosine_learned_temperature", "cosine_no_temperature", "entropy_collapse",
                   "finite_mask_leak", "logit_growth", "naive_softmax", "no_scaling", "output_logit_divergence",
                   "qk_fp16_overflow", "rank_collapse", "rope_low_precision", "left_padding_positions", "mask_broadcast",
                   "mask_min_overflow"}
    versions = dict(text_versions)
    models = {"python_source_char": versions.pop("baseline"), "python_source_lines": versions.pop("text model on lines")}
    hashes = {d: (config_hash(m), config_hash(floor_config(m))) for d, m in models.items()}
    for exp, cfg in versions.items():
        model, floor = hashes[cfg["data"]["name"]]
        assert config_hash(floor_config(cfg)) == floor, exp
        assert (config_hash(control_config(cfg)) == model) == (exp not in own_control), exp


def test_each_text_version_runs_a_tiny_step_on_text_and_measures_it(text_versions, tmp_path):
    """Every text version's configs pass preflight (failure, control, floor), and its failure
    trains one tiny step on text and takes its measures there (none reads the copy task)."""
    import copy

    from experiments.training.loop import Trainer
    from experiments.training.runner import measure_fn, preflight
    tiny = {"model": {"d_model": 16, "n_layers": 1, "n_heads": 2},
            "train": {"steps": 1, "batch_size": 4, "log_every": 1, "diag_every": 1, "eval_batches": 1}}
    for exp, cfg in text_versions.items():
        if exp == "text model on lines":
            continue
        cfg = copy.deepcopy(cfg)
        for section, keys in tiny.items():
            cfg[section].update(keys)
        cfg["model"]["attention"]["d_k"] = None
        seq = 4 if exp == "mask_broadcast" else 8  # mask_broadcast: every batch as long as the batch size
        cfg["data"]["seq_len"] = cfg["model"]["block_size"] = seq
        preflight(cfg)
        trainer = Trainer(cfg, tmp_path / exp)
        if exp == "mask_broadcast_shape_error":  # a batch of 4 lines is 8 long
            with pytest.raises(RuntimeError, match="must match the size of tensor"):
                trainer.run()
            continue
        res = trainer.run()
        assert res.status == "completed" or exp in ("naive_softmax", "fully_masked_rows"), exp
        if res.status == "completed":
            for ref in cfg["exp"]["measures"]:
                out = measure_fn(ref)(trainer, cfg)
                assert out and all(isinstance(v, (int, float, str)) for v in out.values()), (exp, ref)


def test_the_text_table_shows_the_second_corpus_and_why_an_experiment_has_no_text_version(tmp_path):
    from experiments.records import RunRecord
    from experiments.report.sections import text

    def run(exp, data, seed, ok, loss=None):
        return RunRecord(exp=exp, status="completed", role="failure", seed=seed, config={"data": {"name": data}},
                         final={"loss/train": loss} if loss else {}, verdict={"reproduced": ok, "checks": []})
    runs = [run("no_scaling", "copy", s, True) for s in (0, 1, 2)]
    runs += [run("no_scaling", "shakespeare_char", s, True, 2.4) for s in (0, 1, 2)]
    runs += [run("no_scaling", "python_source_char", 0, False, 2.3), run("heads", "two_facts", 0, False)]
    runs += [run("no_scaling", "chichewa_char", s, s != 1, 2.0) for s in (0, 1, 2)]
    md = text.render(runs, tmp_path)
    assert "| Python source: reproduced | Chichewa: reproduced | finding |" in md
    row = next(line for line in md.splitlines() if line.startswith("| no_scaling |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:3] == ["3 of 3", "3 of 3"] and cells[6] == "0 of 1 (n < 3)"  # Shakespeare, then Python source
    assert cells[7] == "2 of 3"                                                   # and Chichewa
    assert "reproduces on shakespeare_char (3 of 3) but not on python_source_char (0 of 1)" in cells[8]
    assert "no_scaling: 3 of 3 on shakespeare_char, 2 of 3 on chichewa_char." in cells[8]
    heads = next(line for line in md.splitlines() if line.startswith("| heads |"))
    assert "no text version: its signature is the two-facts task's" in heads


def test_every_text_version_plots_the_text_loss_and_pairs_the_heatmaps_by_layer(text_versions):
    """Issue 23: five text versions plotted loss/copy (never logged on text: an empty panel), and
    the heatmaps put the failure's layer 0 beside the control's layer 1."""
    import numpy as np

    from experiments.report.figures import shown_heads
    for exp, cfg in text_versions.items():
        assert cfg["exp"]["loss_metric"] == "loss/train", exp  # text batches have no loss groups
    sharp, flat = np.eye(4)[None], np.full((1, 4, 4), 0.25)
    failure = {0: {"L0": flat, "L1": sharp}}   # its most focused head: L1 H0
    control = {0: {"L0": sharp, "L1": flat}}   # its own would be L0 H0
    assert shown_heads([failure, control]) == [("L1", 0), ("L1", 0)]
    assert shown_heads([failure, {0: {"L0": sharp}}]) == [("L1", 0), ("L0", 0)]  # no L1: its own


def test_a_shared_control_is_trained_once_and_measured_for_each_experiment_that_reuses_it(
        compose_cfg, tiny, tmp_path):
    """sum_normalize's control (the softmax) and bilinear_scores' (dot-product scores) are the same
    config: one control dir. bilinear_scores measures cost_vs_dot, which sum_normalize does not:
    measured on the control's saved weights when bilinear_scores reuses it, not trained again."""
    from experiments.training.runner import run_experiment
    a = run_experiment(compose_cfg(["+exp=sum_normalize", *tiny], results_dir=tmp_path), tmp_path / "a")
    cdir = Path(a.control["dir"])
    trained = (cdir / "metrics.csv").read_bytes()
    assert (cdir / "model.pt").exists() and "params/extra_vs_dot" not in a.control["final"]
    b = run_experiment(compose_cfg(["+exp=bilinear_scores", *tiny], results_dir=tmp_path), tmp_path / "b")
    assert Path(b.control["dir"]) == cdir and (cdir / "metrics.csv").read_bytes() == trained
    assert b.control["final"]["params/extra_vs_dot"] == 0  # the control's scores are dot-product
    saved = json.loads((cdir / "summary.json").read_text())
    assert saved["final"]["params/extra_vs_dot"] == 0 and saved["config"]["exp"]["measures"] == ["cost_vs_dot"]
    assert "params/extra_vs_dot" in saved["measured_later"] and "loss/train" not in saved["measured_later"]
    assert [c["passed"] for c in b.verdict["checks"] if c["name"] == "extra parameters"] == [True]
