"""The report, the multirun callback and the W&B payload, on hand-made run dirs (no training)
plus one tiny real multirun through run.py."""
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from experiments import report
from experiments.callbacks import crashed_jobs, finish_multirun, job_dirs
from experiments.io import save_attn_weights, write_json, write_rows_csv
from experiments.report.sections import catalogue
from experiments.training.logger import entropy_by_layer, heads_image, image_steps, payload

ROOT = Path(__file__).resolve().parents[1]


def make_cfg(exp="no_scaling", seed=0, scale="none", steps=20):
    return {"data": {"name": "copy", "vocab_size": 8, "seq_len": 16},
            "model": {"d_model": 32, "n_heads": 2, "attention": {"scale": scale}},
            "optim": {"name": "adamw", "lr": 1e-3}, "train": {"steps": steps, "diag_every": 10},
            "logger": {"name": "none"}, "seed": seed, "results_dir": "results",
            "exp": {"name": exp, "claim": f"claim of {exp}", "expect": [], "broken": BROKEN.get(exp)}}


BROKEN = {"no_scaling": "scores not divided by sqrt(d_k)", "baseline": "nothing (the healthy baseline)"}


def fake_run(d: Path, exp="no_scaling", seed=0, role="failure", loss_end=4.0, measured=3.0,
             control_dir=None, status="completed", expected_error=False, steps=20, scale="none"):
    """A run dir as runner.run_experiment leaves it: summary.json, metrics.csv, attn_weights.npz."""
    d.mkdir(parents=True)
    rows = [{"step": s, "loss/copy": 4.0 + (loss_end - 4.0) * s / (steps - 1),
             "attn/entropy/L0": 2.0 - s / steps, "attn/entropy/L1": 2.0,
             "grad/scores/L0": 10.0 ** (-s / 4), "attn/entropy_head/L0/H0": 1.0}
            for s in range(0, steps, 5)]
    write_rows_csv(d / "metrics.csv", rows)
    w = torch.softmax(torch.randn(2, 7, 7, generator=torch.Generator().manual_seed(seed)), -1)
    save_attn_weights(d / "attn_weights.npz", {0: {"L0": w, "L1": w}, steps - 1: {"L0": w, "L1": w.flip(-1)}})
    cfg = make_cfg(exp, seed, scale, steps)
    check = {"name": "plateau", "kind": "threshold", "metric": "loss/copy", "passed": measured >= 2.0,
             "measured": measured, "expected": ">= 2"}
    summary = {"exp": exp, "role": role, "claim": f"claim of {exp}", "status": status, "seed": seed,
               "final": {"loss/copy": loss_end}, "config_hash": f"{exp}{seed}{steps}{scale}",
               "device": "cpu", "context": {"ln_V": math.log(8)}, "config": cfg,
               "expected_error": expected_error, "error": "RuntimeError: boom" if status == "error" else None,
               "verdict": {"reproduced": measured >= 2.0, "checks": [check]}}
    if control_dir is not None:
        check.update(control=0.5, control_passed=False)
        summary["verdict"]["signature_broken"] = False
        summary["control"] = {"name": "baseline", "dir": str(control_dir), "status": "completed"}
    write_json(d / "summary.json", summary)
    return d


@pytest.fixture
def results(tmp_path):
    """Two seeds of one failure with their controls, and a baseline."""
    res = tmp_path / "results"
    for seed, measured in ((0, 3.0), (1, 1.0)):
        ctrl = fake_run(res / "controls" / f"baseline-c{seed}", exp="baseline", seed=seed, role="control",
                        loss_end=0.01, measured=0.5, scale="sqrt_dk")
        fake_run(res / "multirun" / "2026-01-01_00-00-00" / f"{seed}_no_scaling_seed{seed}",
                 seed=seed, measured=measured, control_dir=ctrl)
    fake_run(res / "runs" / "baseline" / "2026-01-01_00-00-00-000001", exp="baseline", role="baseline",
             loss_end=0.01, measured=2.5, scale="sqrt_dk")
    return res


def test_catalogue_table_has_one_row_per_experiment_with_rates_margins_and_flags(results):
    md = report.build([results], results).read_text()
    row = next(line for line in md.splitlines() if line.startswith("| [no_scaling](#no_scaling) |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # seed 0 measured 3.0, seed 1 1.0 against >= 2: 1 of 2, Wilson [0.09, 0.91]; the worst seed is
    # 1 below the threshold, the sample std is sqrt(2): margin -0.71
    # what is broken: the run's own exp.broken
    assert cells == ["[no_scaling](#no_scaling)", "scores not divided by sqrt(d_k)", "0, 1", "completed ×2", "1 of 2", "0.09–0.91", "0 of 2", "-0.71 (plateau)",
                     "k < n, margin < 2, n < 3"]
    assert "| [baseline](#baseline) | nothing (the healthy baseline) | 0 | completed | 1 of 1 | 0.21–1.00 | – | n/a (1 seed) | n < 3 |" in md
    assert "**Reproduced: 1 of 2 experiments in every seed; 2 of 3 runs.**" in md
    assert "`margin < 2` when a gating check's worst seed lies within 2 standard deviations" in md
    assert "## Verdict per seed" in md and "| no_scaling | 1 | completed | no | plateau: 1 ✗ |" in md
    # controls are reached through their failures and are not catalogue rows of their own
    assert md.count("| [baseline](#baseline) |") == 1
    # the per-check detail sits in the experiment's own section
    section = md[md.index("### no_scaling"):]
    assert ("Seeds 0, 1: reproduced in 1 of 2 (95% interval 0.09–0.91); the signature held on the "
            "control in 0 of 2; status completed ×2.") in section
    assert "| plateau | 1 of 2 | 2 ± 1.4 | 1..3 | >= 2 | 0.5 ± 0 | -0.71 | fails in 1 of 2, margin < 2 |" in section


def test_report_is_deterministic_and_has_no_absolute_paths(results, tmp_path):
    first = report.build([results], results).read_text()
    pngs = sorted(p.name for p in (results / "figures").glob("*.png"))
    assert report.build([results], results).read_text() == first
    assert str(tmp_path) not in first and "2026-01-01" not in first
    assert pngs == ["baseline.png", "no_scaling.png"]
    for name in pngs:
        img = plt_imread(results / "figures" / name)
        assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 600
        assert f"](figures/{name})" in first


def plt_imread(path):
    import matplotlib.image
    return matplotlib.image.imread(path)


def test_runs_table_is_tidy_with_config_columns(results):
    report.build([results], results)
    df = pd.read_csv(results / "runs.csv")
    assert len(df) == 5 * 4  # 5 runs (2 failures, 2 controls, 1 baseline) x 4 logged steps
    assert {"run", "exp", "role", "seed", "step", "loss/copy", "config.model.attention.scale",
            "config.optim.lr"} <= set(df.columns)
    assert sorted(df.groupby("role")["run"].nunique().items()) == [("baseline", 1), ("control", 2), ("failure", 2)]
    assert set(df[df.role == "control"]["config.model.attention.scale"]) == {"sqrt_dk"}


def test_newest_run_of_the_same_config_wins(tmp_path):
    res = tmp_path / "r"
    fake_run(res / "runs" / "baseline" / "2026-01-01_00-00-00-000001", exp="baseline", role="baseline", measured=2.1)
    fake_run(res / "runs" / "baseline" / "2026-01-02_00-00-00-000001", exp="baseline", role="baseline", measured=2.2)
    fake_run(res / "runs" / "baseline" / "2025-12-31_00-00-00-000001", exp="baseline", role="baseline", measured=2.0)
    runs = report.load_runs([res])
    assert [r.verdict["checks"][0]["measured"] for r in runs] == [2.2]


def test_variants_of_one_experiment_are_labelled_by_what_differs(tmp_path):
    res = tmp_path / "r"
    fake_run(res / "a", exp="baseline", role="baseline", steps=20)
    fake_run(res / "b", exp="baseline", role="baseline", steps=40)
    md = report.build([res], res).read_text()
    assert "| [baseline [train.steps=20]](#baseline-trainsteps20) |" in md
    assert "| [baseline [train.steps=40]](#baseline-trainsteps40) |" in md
    assert "### baseline [train.steps=20]" in md  # the section the link goes to
    for i in range(4):  # more configs than MAX_VARIANTS: a sweep, one row
        fake_run(res / f"c{i}", exp="phase", role="baseline", steps=10 + i)
    md = report.build([res], res).read_text()
    assert "| phase (sweep of 4 configs) |  | 0 | completed ×4 | 4 of 4 runs | – | – | see its section |  |" in md


def test_a_sweep_names_what_it_varied(tmp_path, capsys):
    """Issue 23: `-m +exp=no_scaling model.attention.d_k=16 seed=0,1` reported '0 of 2 reproduced'
    under the bare name, as if the tool had failed: the label names the command line's overrides."""
    sweep = tmp_path / "multirun" / "2026-01-01_00-00-00"
    for seed in (0, 1):
        d = fake_run(sweep / f"{seed}_no_scaling_seed{seed}", seed=seed, measured=1.0)
        (d / ".hydra").mkdir()
        (d / ".hydra" / "overrides.yaml").write_text(
            f"- +exp=no_scaling\n- model.attention.d_k=16\n- seed={seed}\n- logger=none\n- hydra/launcher=parallel\n")
    md = report.build([sweep], sweep).read_text()
    assert "| [no_scaling [model.attention.d_k=16]](#no_scaling-modelattentiond_k16) |" in md
    assert "### no_scaling [model.attention.d_k=16]" in md
    finish_multirun(sweep)
    assert "verdict: no_scaling [model.attention.d_k=16]: 0 of 2 seeds reproduced" in capsys.readouterr().out


def test_readme_blocks_are_replaced_with_links_relative_to_the_readme(results, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- BEGIN report:catalogue -->\nstale text\n<!-- END report:catalogue -->\n"
                      "<!-- BEGIN report:figure:no_scaling -->\n<!-- END report:figure:no_scaling -->\n"
                      "<!-- BEGIN report:nope -->\nkept\n<!-- END report:nope -->\nend\n")
    missing = report.update_readme(readme, report.render_blocks(report.load_runs([results]),
                                                                results / "figures"), results)
    text = readme.read_text()
    assert missing == ["nope"] and "kept" in text and "stale text" not in text
    assert "| [no_scaling](results/REPORT.md#no_scaling) |" in text and "](results/figures/no_scaling.png)" in text
    assert text.startswith("intro\n") and text.endswith("end\n")


def test_stale_figures_are_removed(results):
    (results / "figures").mkdir(parents=True)
    (results / "figures" / "gone.png").write_bytes(b"x")
    report.build([results], results)
    assert not (results / "figures" / "gone.png").exists()


def test_cli_rejects_a_missing_dir(tmp_path, capsys):
    assert report.main([str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_spread_and_fmt():
    assert catalogue.spread([1.0, 3.0]) == "2 ± 1.4"
    assert catalogue.spread(["error", "error", "completed"]) == "completed, error ×2"
    assert catalogue.spread([1.0, math.inf]) == "1, inf"
    assert catalogue.fmt(1.23456e-5) == "1.23e-05" and catalogue.fmt(None) == "–"


# -- the multirun's exit code -------------------------------------------------------------------

def job(sweep: Path, name: str, **kw) -> Path:
    d = fake_run(sweep / name, **kw)
    (d / ".hydra").mkdir()
    return d


def test_only_unexpected_crashes_count(tmp_path):
    sweep = tmp_path / "sweep"
    job(sweep, "0_ok")
    job(sweep, "1_diverged", status="diverged")
    job(sweep, "2_expected_error", status="error", expected_error=True)
    assert crashed_jobs(sweep) == [] and finish_multirun(sweep) == 0
    assert (sweep / "REPORT.md").exists()
    assert len(job_dirs(sweep)) == 3  # the report's own figures/ is not a job
    job(sweep, "3_crash", status="error")
    (sweep / "4_no_summary" / ".hydra").mkdir(parents=True)
    crashed = crashed_jobs(sweep)
    assert [(d.name, why.split(":")[0]) for d, why in crashed] == [("3_crash", "status error"),
                                                                   ("4_no_summary", "no summary.json (the job crashed; see its log)")]
    assert finish_multirun(sweep) == 1


def test_multirun_prints_each_experiments_rate_and_verdicts_do_not_set_the_exit_code(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    for seed, measured in ((0, 3.0), (1, 1.0), (2, 0.5)):  # reproduced in seed 0 only
        ctrl = fake_run(tmp_path / "controls" / f"c{seed}", exp="baseline", seed=seed, role="control",
                        measured=0.5, scale="sqrt_dk")
        job(sweep, f"{seed}_no_scaling_seed{seed}", seed=seed, measured=measured, control_dir=ctrl)
    job(sweep, "3_baseline_seed0", exp="baseline", role="baseline", measured=0.0, scale="sqrt_dk")
    assert finish_multirun(sweep) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("verdict: ")]
    assert lines == ["verdict: baseline: 0 of 1 seeds reproduced (95% interval 0.00–0.79); no control [k < n, n < 3]",
                     "verdict: no_scaling: 1 of 3 seeds reproduced (95% interval 0.06–0.79); control 0 of 3 "
                     "[k < n, margin < 2]"]


def test_multirun_ends_with_a_report_in_the_sweep_dir(tiny, tmp_path):
    sweep = tmp_path / "sweep"
    r = subprocess.run([sys.executable, "run.py", "-m", "+exp=baseline", "seed=0,1", *tiny,
                        f"results_dir={tmp_path}", f"hydra.sweep.dir={sweep}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "WANDB_MODE": "disabled"})
    assert r.returncode == 0, r.stderr[-2000:]
    md = (sweep / "REPORT.md").read_text()
    # the row names the sizes the command line gave (what this sweep changed against the catalogue)
    assert re.search(r"\| \[baseline \[model.d_model=32, [^\]]*train.steps=6[^\]]*\]\]\(#baseline-[^)]*\) \| "
                     r"nothing \(the healthy baseline\) \| 0, 1 \| completed ×2 \| [012] of 2 \|", md)
    assert re.search(r"\| copy task solved \| [012] of 2 \| \S+ ± \S+ \| \S+\.\.\S+ \| <= 0.05 \|", md)
    # the last lines: each experiment's rate (six steps do not solve the copy: a finding, exit 0)
    assert re.search(r"^verdict: baseline \[[^\]]*train.steps=6[^\]]*\]: [012] of 2 seeds reproduced \(95% interval ",
                     r.stdout, re.M), r.stdout
    (fig,) = (sweep / "figures").glob("baseline_model.d_model=32*.png")
    assert fig.stat().st_size > 10_000
    assert len(pd.read_csv(sweep / "runs.csv")) == 2 * 5  # steps 0, 2, 3, 4, 5 (log or diagnostic) per run


# -- W&B payload ----------------------------------------------------------------------------------

def test_image_steps_spread_over_the_diagnostic_steps():
    assert image_steps(600, 50) == {0, 150, 300, 450, 599}
    assert image_steps(6, 3) == {0, 3, 5}
    assert image_steps(100, 0) == set()


def test_heads_image_places_heads_side_by_side_and_marks_nan():
    w = torch.softmax(torch.randn(3, 5, 5), -1)
    w[1, 0, 0] = float("nan")
    img = heads_image(w, scale=2)
    assert img.shape == (10, 2 * (3 * 6 - 1), 3) and img.dtype == np.uint8
    assert tuple(img[0, 2 * 6]) == (255, 0, 0)          # head 1, query 0, key 0: NaN in red
    assert tuple(img[0, 2 * 5]) == (255, 255, 255)      # the gap after head 0


def test_payload_keeps_csv_names_and_adds_media():
    import wandb
    row = {"loss/train": 1.0, "attn/entropy_head/L0/H0": 0.5, "attn/entropy_head/L0/H1": 1.5,
           "attn/entropy_head/L1/H0": 2.0}
    assert entropy_by_layer(row) == {"L0": [0.5, 1.5], "L1": [2.0]}
    attn = {"L0": torch.softmax(torch.randn(2, 4, 4), -1)}
    p = payload(row, 7, attn, log_images=True)
    assert {k: v for k, v in p.items() if not hasattr(v, "_log_type")} == {**row, "step": 7}
    assert isinstance(p["attn/entropy_heads/L0"], wandb.Histogram)
    assert isinstance(p["attn/weights/L0"], wandb.Image)
    assert "attn/weights/L0" not in payload(row, 7, attn, log_images=False)


def test_offline_wandb_run_writes_the_heatmap_image(tmp_path):
    import wandb

    from experiments.training.logger import WandbLogger
    cfg = {"train": {"steps": 6, "diag_every": 3}, "seed": 0}
    lg = WandbLogger({"mode": "offline", "project": "test", "entity": None}, tmp_path, cfg, "x-seed0", "x",
                     ["x", "failure", "seed0"])
    lg.log({"loss/train": 1.0, "attn/entropy_head/L0/H0": 0.3}, 0,
           attn={"L0": torch.softmax(torch.randn(2, 5, 5), -1)})
    lg.log({"loss/train": 0.5}, 1, attn={"L0": torch.softmax(torch.randn(2, 5, 5), -1)})  # not an image step
    lg.summary({"reproduced": True})
    lg.finish()
    wandb.teardown()
    images = list(tmp_path.glob("wandb/offline-run-*/files/media/images/attn/weights/L0_0_*.png"))
    assert len(images) == 1 and plt_imread(images[0]).shape == (20, 4 * (2 * 6 - 1), 3)
    assert not list(tmp_path.glob("wandb/offline-run-*/files/media/images/attn/weights/L0_1_*.png"))


def test_a_crashed_job_summary_is_reported_and_counted(tmp_path):
    """run.py's crash path leaves a minimal summary (no role, verdict, context): the report lists
    it with its status, and the multirun exits non-zero."""
    sweep = tmp_path / "sweep"
    job(sweep, "0_ok")
    (sweep / "1_crash" / ".hydra").mkdir(parents=True)
    write_json(sweep / "1_crash" / "summary.json", {"exp": "crashy", "status": "error", "seed": 0,
                                                     "error": "RuntimeError: boom", "config": make_cfg("crashy")})
    assert finish_multirun(sweep) == 1
    md = (sweep / "REPORT.md").read_text()
    assert "| [crashy](#crashy) |  | 0 | error | 0 of 1 | 0.00–0.79 | – | (no checks) | k < n, n < 3 |" in md and "device: cpu." in md


def test_multirun_with_a_job_that_left_no_summary_exits_non_zero(tiny, tmp_path):
    sweep = tmp_path / "sweep"
    r = subprocess.run([sys.executable, "run.py", "-m", "+exp=baseline", *tiny, "model.n_heads=3",
                        f"results_dir={tmp_path}", f"hydra.sweep.dir={sweep}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "WANDB_MODE": "disabled"})
    assert r.returncode == 1, r.stderr[-2000:]
    # a rejected config is no run, but the sweep's last lines say which cell and why
    assert ("crashed: 0_baseline_seed0: config rejected: model.d_model=32 is not divisible by "
            "model.n_heads=3") in r.stderr
    assert "No runs found." in (sweep / "REPORT.md").read_text()


def test_a_run_that_logged_no_step_is_reported(tmp_path):
    """A run that stops before its first logged step (the shape-error case) has an empty
    metrics.csv; the report lists it instead of failing on it."""
    from experiments.io import write_rows_csv
    sweep = tmp_path / "sweep"
    job(sweep, "0_ok")
    d = sweep / "1_early"
    (d / ".hydra").mkdir(parents=True)
    write_rows_csv(d / "metrics.csv", [])
    write_json(d / "summary.json", {"exp": "early", "status": "error", "seed": 0, "expected_error": True,
                                    "error": "RuntimeError: shape", "config": make_cfg("early")})
    assert finish_multirun(sweep) == 0
    assert "| [early](#early) |" in (sweep / "REPORT.md").read_text()


def test_slug_of_a_long_variant_label_is_short_and_unique():
    from experiments.report.sections.catalogue import slug
    a, b = "exp " + "model.attention.x=1 " * 30, "exp " + "model.attention.x=1 " * 29 + "y=2"
    assert slug("no_scaling [d_k=64]") == "no_scaling_d_k=64"
    assert len(slug(a)) <= 96 and len(slug(b)) <= 96 and slug(a) != slug(b)


def test_a_section_that_fails_to_render_exits_1_names_it_and_leaves_the_readme_alone(results, tmp_path,
                                                                                       monkeypatch, capsys):
    from experiments.report.sections import disk

    def broken(runs, fig_dir):
        raise KeyError("no_such_metric")
    monkeypatch.setattr(disk, "render", broken)
    readme = tmp_path / "README.md"
    readme.write_text("<!-- BEGIN report:catalogue -->\nSTALE-BLOCK\n<!-- END report:catalogue -->\n")
    assert report.main([str(results), "--readme", str(readme)]) == 1
    err = capsys.readouterr().err
    assert "error: report section disk failed to render: KeyError: 'no_such_metric'" in err
    assert readme.read_text() == "<!-- BEGIN report:catalogue -->\nSTALE-BLOCK\n<!-- END report:catalogue -->\n"
    assert "This section failed to render: `KeyError: 'no_such_metric'`" in (results / "REPORT.md").read_text()
    monkeypatch.undo()  # whole again: exit 0, the README's block written
    assert report.main([str(results), "--readme", str(readme)]) == 0 and "STALE-BLOCK" not in readme.read_text()


def test_sections_renders_one_section_in_place_and_leaves_the_rest(results, tmp_path, capsys):
    """`--sections bench`: a section read from committed JSON refreshed without the runs the others
    need; the same bytes as a whole build's, the rest of REPORT.md as it was."""
    from experiments.io import write_json
    assert report.main([str(results)]) == 0
    whole = (results / "REPORT.md").read_text()
    assert "## Benchmarks" not in whole
    write_json(results / "bench" / "cost.json", {"bench": "cost", "d": 4, "exact": True, "predicted": 8, "counted": 8,
                                                 "timed": 8, "rows": []})
    assert report.main([str(results)]) == 0
    with_bench = (results / "REPORT.md").read_text()
    write_json(results / "bench" / "cost.json", {"bench": "cost", "d": 4, "exact": True, "predicted": 8, "counted": 8,
                                                 "timed": 16, "rows": []})
    empty = tmp_path / "no_runs"
    empty.mkdir()
    assert report.main([str(empty), "--out", str(results), "--sections", "bench"]) == 0  # no runs needed
    refreshed = (results / "REPORT.md").read_text()
    assert refreshed == with_bench.replace("timed T = 8.", "timed T = 16.") != with_bench
    assert report.main([str(results), "--sections", "catalogue,nope"]) == 2
    assert "no section 'nope'" in capsys.readouterr().err and (results / "REPORT.md").read_text() == refreshed


def test_sections_replaces_every_heading_of_a_section_that_has_several(results):
    """The catalogue renders several `## ` headings (its table, the verdict per seed, one section
    per experiment): `--sections catalogue` replaces them all, it does not add them a second time."""
    assert report.main([str(results)]) == 0
    whole = (results / "REPORT.md").read_text()
    assert whole.count("\n## ") > 2 and whole.count("\n## Verdict per seed\n") == 1
    assert report.main([str(results), "--sections", "catalogue"]) == 0
    assert (results / "REPORT.md").read_text() == whole


def test_a_one_run_experiment_shows_the_figure_its_run_drew_unless_the_verdict_is_newer(tmp_path):
    from experiments.records import RunRecord
    d = fake_run(tmp_path / "runs" / "a", "no_scaling")
    record = RunRecord.read(d)
    (d / "curves.png").write_bytes(b"the run's own figure")
    out = tmp_path / "figures"
    out.mkdir()
    catalogue.figure("no_scaling", [record], out)
    assert (out / "no_scaling.png").read_bytes() == b"the run's own figure"
    os.utime(d / "curves.png", (1, 1))  # judged again after its figure: drawn from the runs
    catalogue.figure("no_scaling", [record], out)
    assert (out / "no_scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    os.utime(d / "curves.png")  # the run's figure is new again, but two seeds are drawn side by side
    two = [record, RunRecord.read(fake_run(tmp_path / "runs" / "b", "no_scaling", seed=1))]
    catalogue.figure("no_scaling", two, out)
    assert (out / "no_scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_given_overrides_is_titled_by_them_and_its_figure_copied_under_that_label(tmp_path):
    """A one-seed sweep with sizes given (the README's commands in the tests): the report's label
    names the overrides, and so does the run's own figure, which the report then copies."""
    from unittest.mock import patch

    from experiments.records import RunRecord
    from experiments.report import figures
    from experiments.report.figures import draw_curves
    d = fake_run(tmp_path / "runs" / "a", "no_scaling")
    (d / ".hydra").mkdir()
    (d / ".hydra" / "overrides.yaml").write_text("- +exp=no_scaling\n- seed=0\n- train.steps=6\n- logger=none\n")
    record = RunRecord.read(d)
    record.config["exp"]["loss_metric"] = "loss/copy"   # as run.py's config has it
    assert record.given_overrides() == ["train.steps=6"]  # seed and logger change nothing trained
    assert record.title() == "no_scaling [train.steps=6]"
    [group] = catalogue.groups([record])
    assert group.label == record.title()
    titles = []
    with patch.object(figures, "plot_experiment", lambda path, name, *a, **k: titles.append(name)):
        draw_curves(record, d / "curves.png")
    assert titles == ["no_scaling [train.steps=6]"]   # the run's figure says what it was trained with
    draw_curves(record, d / "curves.png")
    own = (d / "curves.png").read_bytes()
    out = tmp_path / "figures"
    out.mkdir()
    catalogue.figure(group.label, [record], out)
    assert (out / f"{catalogue.slug(group.label)}.png").read_bytes() == own
    drawn = []
    with patch.object(catalogue, "plot_experiment", lambda path, name, *a, **k: drawn.append(name)):
        catalogue.figure("no_scaling", [record], out)  # another label than the run's title: drawn anew
    assert drawn == ["no_scaling"]
