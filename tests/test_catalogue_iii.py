"""Catalogue III (issue 13, items 1, 4, 5): the LR-sensitivity metric, log Z and the z-loss, the
rank-1 residual and the attention-only stack without skips, and their experiments' configs."""
import math

import pytest
import torch

from attention import ModelConfig, TransformerLM
from experiments.report.sections.lr_sensitivity import blowup_lr, lr_sensitivity
from experiments.training.loop import Trainer, log_z, mean_loss, token_losses
from experiments.training.measures.rank import layer_residuals, rank1_residual


# -- lr sensitivity ----------------------------------------------------------------------------
def test_lr_sensitivity_on_a_hand_made_table():
    init = 4.0
    finals = {1e-3: 1.0, 3e-3: 0.5, 1e-2: 0.2, 3e-2: 6.0, 1e-1: math.nan}
    # min(final, init): 1, 0.5, 0.2, 4 (capped), 4 (diverged counts as init); best 0.2
    assert lr_sensitivity(finals, init) == pytest.approx((1 + 0.5 + 0.2 + 4 + 4) / 5 - 0.2)
    assert lr_sensitivity({1e-3: 0.3, 1e-2: 0.3}, init) == 0.0      # flat: insensitive
    assert blowup_lr(finals, level=0.4) == 3e-2                       # first lr above the best (1e-2)
    assert blowup_lr(finals, level=7.0) == 1e-1                       # NaN exceeds any level
    assert blowup_lr({1e-3: 0.3, 1e-2: 0.2}, level=0.4) is None       # never in the grid


# -- log Z and the z-loss ------------------------------------------------------------------------
def test_log_z_is_the_logsumexp_of_the_logits():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7) * 3
    ref = torch.log(torch.exp(logits.double()).sum(-1)).float()
    assert torch.allclose(log_z(logits), ref, atol=1e-5)


def _one_step_loss(compose_cfg, tiny, tmp_path, z):
    """The loss the trainer backpropagates on step 0, and what it is made of."""
    cfg = compose_cfg([*tiny, f"train.z_loss={z}"])
    t = Trainer(cfg, tmp_path)
    batch = t.task.batch(0, cfg["train"]["batch_size"]).to(t.device)
    loss, _, metrics = t.train_step(batch, log=True, diag=False)
    with torch.no_grad():
        t2 = Trainer(cfg, tmp_path)  # same seed: the same weights before the step
        logits = t2.model(batch.x)
        ce = mean_loss(token_losses(logits, batch), batch)
        zterm = mean_loss(log_z(logits).pow(2), batch)
    return float(loss.detach()), float(ce), float(zterm), metrics


def test_z_loss_adds_exactly_z_times_mean_log_z_squared(compose_cfg, tiny, tmp_path):
    loss0, ce, zterm, m0 = _one_step_loss(compose_cfg, tiny, tmp_path, 0.0)
    loss1, _, _, m1 = _one_step_loss(compose_cfg, tiny, tmp_path, 0.5)
    assert loss0 == pytest.approx(ce, abs=1e-6)
    assert loss1 - loss0 == pytest.approx(0.5 * zterm, rel=1e-5)
    assert zterm > 1.0                                               # log Z ~ ln V at init: not vacuous
    assert float(m1["loss/train"]) == pytest.approx(ce, abs=1e-6)    # logged: the cross-entropy alone
    assert float(m0["logz/mean"]) ** 2 <= zterm + 1e-5               # mean^2 <= mean of squares
    assert float(m0["logz/max_abs"]) >= abs(float(m0["logz/mean"]))


# -- rank collapse -----------------------------------------------------------------------------
def test_rank1_residual_is_zero_for_1_xT_and_near_one_for_noise():
    torch.manual_seed(0)
    x = torch.randn(16)
    assert float(rank1_residual(torch.ones(8, 1) * x)) < 1e-6
    assert float(rank1_residual(torch.randn(64, 32))) == pytest.approx(1.0, abs=0.05)
    assert rank1_residual(torch.randn(3, 8, 4)).shape == (3,)


def _stack(residual, n_layers=8):
    torch.manual_seed(0)
    return TransformerLM(ModelConfig(vocab_size=16, block_size=16, d_model=16, n_layers=n_layers, n_heads=2,
                                     mlp=False, residual=residual))


def test_attention_only_stack_without_skips_collapses_at_init():
    x = torch.randint(0, 16, (4, 16), generator=torch.Generator().manual_seed(0))
    no_skip, skip = layer_residuals(_stack(False), x), layer_residuals(_stack(True), x)
    assert len(no_skip) == 9 and no_skip[0] > 0.9
    assert no_skip[-1] < 0.05 * no_skip[0]                          # measured ~1e-2 of the embeddings'
    assert all(b <= a * 1.01 for a, b in zip(no_skip, no_skip[1:]))
    assert skip[-1] > 0.8                                           # skips keep the tokens apart


def test_switches_drop_the_mlp_and_default_model_is_unchanged():
    kw = dict(vocab_size=16, block_size=16, d_model=16, n_layers=2, n_heads=2)
    torch.manual_seed(0)
    a = TransformerLM(ModelConfig(**kw))
    torch.manual_seed(0)
    b = TransformerLM(ModelConfig(**kw, mlp=True, residual=True))
    x = torch.randint(0, 16, (2, 16))
    assert torch.equal(a(x), b(x))
    no_mlp = TransformerLM(ModelConfig(**kw, mlp=False))
    assert all(blk.mlp is None and blk.ln_2 is None for blk in no_mlp.blocks)
    assert no_mlp.param_count()["total"] < a.param_count()["total"]


# -- the experiments' configs ------------------------------------------------------------------
@pytest.mark.parametrize("name", ["lr_sensitivity", "rank_collapse", "rank_collapse_depth", "output_logit_divergence"])
def test_new_experiments_compose_and_pass_preflight(name, compose_cfg, tmp_path):
    from experiments.training.runner import preflight
    cfg = compose_cfg([f"+exp={name}", "logger=none"], results_dir=tmp_path)
    assert cfg["exp"]["name"] == name and cfg["exp"]["claim"]
    preflight(cfg)


def test_rank_measure_runs_on_a_tiny_model(compose_cfg, tiny, tmp_path):
    from experiments.training.measures.rank import rank_residuals
    cfg = compose_cfg([*tiny, "model.mlp=false", "model.residual=false", "model.n_layers=3"])
    t = Trainer(cfg, tmp_path)
    m = rank_residuals(t, cfg)
    assert m["rank/init/depth3"] == m["rank/trained/depth3"] == m["rank/init/last"]  # untrained: the same model
    assert m["rank/init/depth3"] < m["rank/init/depth0"]


def test_lr_sensitivity_and_rank_sections_render_from_runs(compose_cfg, tiny, tmp_path):
    """The two sections read real run records: one lr_sensitivity cell per fix and width, and a
    rank_collapse run with its skip-connection control."""
    from experiments.records import RunRecord
    from experiments.report.sections import lr_sensitivity as lrs
    from experiments.report.sections import rank_collapse as rc
    from experiments.training.runner import run_experiment
    runs = []
    for i, (qk, lr) in enumerate([(False, 1e-3), (False, 3e-1), (True, 1e-3), (True, 3e-1)]):
        cfg = compose_cfg(["+exp=lr_sensitivity", *tiny, f"model.attention.qk_norm={qk}", f"optim.lr={lr}"],
                          results_dir=tmp_path)
        run_experiment(cfg, tmp_path / f"lr{i}")
        runs.append(RunRecord.read(tmp_path / f"lr{i}"))
    md = lrs.render(runs, tmp_path / "fig")
    assert "| no fix | 32 | 16 |" in md and "| qk-layernorm | 32 | 16 |" in md
    assert (tmp_path / "fig" / "lr_sensitivity.png").stat().st_size > 1000
    cfg = compose_cfg(["+exp=rank_collapse", *tiny, "model.n_layers=3"], results_dir=tmp_path)
    s = run_experiment(cfg, tmp_path / "rank")
    run = RunRecord.read(tmp_path / "rank")
    run.control_run = RunRecord.read(s.control["dir"])
    md = rc.render([run], tmp_path / "fig")
    assert "no skips" in md and "skips" in md and (tmp_path / "fig" / "rank_collapse.png").exists()
