"""The failure catalogue at the unit level: each toggle does exactly its damage, and every
conf/exp overlay of the catalogue composes, builds and wires its verdict."""
import math

import pytest
import torch

from attention import MultiHeadAttention
from attention.softmax import normalize_by_sum, softmax_naive, softmax_stable
from data.synthetic import IGNORE, PaddedCopyTask

CATALOGUE = ["naive_softmax", "sum_normalize", "mask_broadcast", "mask_broadcast_shape_error",
             "fully_masked_rows", "head_merge_no_transpose", "attn_dropout_rows",
             "cosine_no_temperature", "cosine_learned_temperature", "additive_scores",
             "bilinear_scores", "logit_growth", "entropy_collapse"]


def mha(**kw):
    torch.manual_seed(0)
    return MultiHeadAttention(d_model=16, n_heads=2, backend="explicit", **kw)


def x_in(B=3, T=3, d=16, seed=1):
    return torch.randn(B, T, d, generator=torch.Generator().manual_seed(seed))


# -- softmax -------------------------------------------------------------------------------------
def test_naive_softmax_overflows_where_stable_does_not():
    s = torch.tensor([[1.0, 2.0, 3.0]])
    torch.testing.assert_close(softmax_naive(s), softmax_stable(s))
    big = torch.tensor([[80.0, 90.0, 0.0]])             # exp(90) > float32 max (~exp(88.72))
    assert torch.isnan(softmax_naive(big)).any()
    assert torch.isfinite(softmax_stable(big)).all()
    half = torch.tensor([[11.0, 11.2]], dtype=torch.float16)  # float16: exp overflows above ~11.09
    assert torch.isnan(softmax_naive(half)).any()
    assert torch.isfinite(softmax_naive(torch.tensor([[11.0, 11.05]], dtype=torch.float16))).all()


def test_normalize_by_sum_gives_negative_weights_summing_to_one():
    w = normalize_by_sum(torch.tensor([[1.0, -2.0, 3.0]]))
    torch.testing.assert_close(w, torch.tensor([[0.5, -1.0, 1.5]]))
    assert float(w.sum()) == pytest.approx(1.0)


def test_sum_normalized_attention_leaves_the_convex_hull():
    from attention.diagnostics import Recorder, hull_violation
    m = mha(softmax="sum")
    m.recorder = Recorder()
    m(x_in(), x_in(), x_in(), is_causal=True)
    assert m.recorder.stats["attn/negative_weights/L0"] > 0
    assert m.recorder.stats["attn/hull_violation/L0"] > 0
    v = torch.tensor([[[[0.0], [1.0]]]])                 # values 0 and 1: a convex mix stays in [0, 1]
    assert float(hull_violation(torch.tensor([[[[1.5]]]]), v)) == pytest.approx(0.5)
    assert float(hull_violation(torch.tensor([[[[0.3]]]]), v)) == 0.0


# -- masks ---------------------------------------------------------------------------------------
def test_broadcast_bug_mixes_examples_exactly_when_batch_equals_query_length():
    B = T = 3
    x = x_in(B, T)
    kpm = torch.tensor([[False, True, True], [True, True, True], [False, False, True]])
    bug, ok = mha(mask_mode="broadcast_bug"), mha()
    out_bug, _ = bug(x, x, x, key_padding_mask=kpm)
    out_ok, _ = ok(x, x, x, key_padding_mask=kpm)
    assert not torch.allclose(out_bug, out_ok)              # silently wrong, no error
    for t in range(T):  # query t of every example was masked with example t's padding row
        ref, _ = ok(x, x, x, key_padding_mask=kpm[t].expand(B, T))
        torch.testing.assert_close(out_bug[:, t], ref[:, t])
    same = kpm[1].expand(B, T)                               # identical rows: the bug is invisible
    torch.testing.assert_close(bug(x, x, x, key_padding_mask=same)[0], ok(x, x, x, key_padding_mask=same)[0])
    with pytest.raises(RuntimeError, match="must match the size"):
        bug(x_in(2, T), x_in(2, T), x_in(2, T), key_padding_mask=kpm[:2])  # B != T_q: the lucky case


def test_neg_inf_fill_makes_fully_masked_rows_nan_finite_fill_does_not():
    x = x_in(2, 4)
    kpm = torch.tensor([[False, False, True, True], [True, True, True, True]])  # left padding
    out, _ = mha(mask_fill="neg_inf")(x, x, x, is_causal=True, key_padding_mask=kpm)
    assert torch.isnan(out[0, :2]).all() and torch.isfinite(out[0, 2:]).all()
    assert torch.isfinite(out[1]).all()
    out, _ = mha(mask_fill="finite")(x, x, x, is_causal=True, key_padding_mask=kpm)
    assert torch.isfinite(out).all()


# -- merge ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("merge,leaks", [("no_transpose", True), ("correct", False)])
def test_no_transpose_merge_lets_position_t_depend_on_later_inputs(merge, leaks):
    T = 6
    x = x_in(1, T).requires_grad_(True)
    out, _ = mha(merge=merge)(x, x, x, is_causal=True)
    future = []
    for t in range(T):
        (g,) = torch.autograd.grad(out[0, t].sum(), x, retain_graph=True)
        future.append(float(g[0, t + 1:].abs().sum()))
    assert (max(future) > 1e-6) == leaks


# -- scores --------------------------------------------------------------------------------------
def test_cosine_scores_are_bounded_and_weights_within_e_squared():
    m = mha(score="cosine", scale="none")
    q, k = torch.randn(2, 2, 5, 8) * 100, torch.randn(2, 2, 5, 8) * 100
    q, k = m.scoring.qk(q, k)
    s = m.scores(q, k)
    assert s.abs().max() <= 1 + 1e-5
    with torch.no_grad():
        _, w = m(x_in() * 50, x_in() * 50, x_in() * 50, need_weights=True)
    assert float((w.max(-1).values / w.min(-1).values).max()) <= math.e ** 2 * (1 + 1e-4)


def test_learned_cosine_temperature_is_a_parameter_that_sharpens():
    m = mha(score="cosine", scale="learned")
    assert m.log_scale.requires_grad
    with torch.no_grad():
        m.log_scale.fill_(math.log(50.0))
        _, w = m(x_in(), x_in(), x_in(), need_weights=True)
    assert float((w.max(-1).values / w.min(-1).values).max()) > math.e ** 2


def test_additive_and_bilinear_scores_shapes_and_bilinear_identity_start():
    q, k = torch.randn(2, 2, 4, 8), torch.randn(2, 2, 5, 8)
    assert mha(score="additive").scores(q, k).shape == (2, 2, 4, 5)
    bil, dot = mha(score="bilinear"), mha(score="dot")
    torch.testing.assert_close(bil.scores(q, k), dot.scores(q, k))  # W = I: dot-product exactly


def test_attention_dropout_rows_sum_to_one_only_in_eval():
    m = mha(dropout=0.5)
    x = x_in(4, 8)
    torch.manual_seed(0)
    _, w_train = m(x, x, x, is_causal=True, need_weights=True)
    m.eval()
    _, w_eval = m(x, x, x, is_causal=True, need_weights=True)
    assert (w_eval.sum(-1) - 1).abs().max() < 1e-6
    assert (w_train.sum(-1) - 1).abs().mean() > 0.05
    kept = w_train > 0
    torch.testing.assert_close(w_train[kept], w_eval[kept] * 2.0)  # scaled by 1 / (1 - p)


# -- data ----------------------------------------------------------------------------------------
def test_padded_copy_left_padding_mask_and_targets():
    task = PaddedCopyTask(vocab_size=16, seq_len=21, min_len=3, max_len=10, seed=0)
    b = task.batch(0, 64)
    assert b.x.shape == b.y.shape == b.key_padding_mask.shape == (64, 20)
    n_pad = (~b.key_padding_mask).sum(1)
    lengths = (21 - n_pad) // 2
    assert ((21 - n_pad) % 2 == 0).all() and lengths.min() >= 3 and lengths.max() <= 10
    assert len(set(lengths.tolist())) > 3                                   # lengths vary
    assert (b.key_padding_mask.int().diff(dim=1) >= 0).all()                # padding on the left
    for i in range(64):
        P, L = int(n_pad[i]), int(lengths[i])
        s = torch.cat([b.x[i], b.y[i, -1:]])
        assert torch.equal(s[P:P + L], s[P + L:])                           # the real part repeats
        assert (b.y[i, :P] == IGNORE).all() and (b.y[i, P:] != IGNORE).all()
        assert int(b.groups["copy"][i].sum()) == L - 1
        assert int(b.groups["first_half"][i].sum()) == L - 1
    assert torch.equal(task.batch(3, 8).x, PaddedCopyTask(16, 21, 3, 10, seed=0).batch(3, 8).x)
    with pytest.raises(ValueError, match="max_len"):
        PaddedCopyTask(seq_len=21, max_len=11)


# -- the overlays ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CATALOGUE)
def test_catalogue_overlay_composes_and_builds(name, compose_cfg, tmp_path):
    from experiments.training.runner import control_config, preflight
    cfg = compose_cfg([f"+exp={name}", "logger=none"], results_dir=tmp_path)
    e = cfg["exp"]
    assert e["name"] == name and e["claim"] and e["expect"] and e["control"]["overrides"]
    preflight(cfg)  # the run and its control would build; every check and expression parses
    ctrl = control_config(cfg)
    assert any(ctrl_diff for ctrl_diff in e["control"]["overrides"])
    assert ctrl["model"] != cfg["model"] or ctrl["train"] != cfg["train"]


def _run(compose_cfg, tmp_path, overrides):
    from experiments.training.runner import run_experiment
    cfg = compose_cfg(overrides, results_dir=tmp_path)
    return run_experiment(cfg, tmp_path / "run")


def test_shape_error_variant_is_a_reproduced_error(compose_cfg, tiny, tmp_path):
    from run import exit_code  # the entry point's: an expected error exits 0
    s = _run(compose_cfg, tmp_path, ["+exp=mask_broadcast_shape_error", *tiny, "data.max_len=7",
                                     "train.steps=2"])
    assert s.status == "error" and "must match the size" in s.error
    assert s.verdict["reproduced"] and s.control["status"] == "completed"
    assert exit_code(s) == 0


def test_fully_masked_rows_diverge_at_step_zero(compose_cfg, tiny, tmp_path):
    s = _run(compose_cfg, tmp_path, ["+exp=fully_masked_rows", *tiny, "data.max_len=7",
                                     "train.batch_size=8", "train.steps=2"])
    assert s.status == "diverged" and s.nonfinite["step"] == 0
    assert "attn.softmax" in s.nonfinite["module"]
    assert s.verdict["reproduced"]


def test_measures_on_a_tiny_untrained_model(compose_cfg, tiny, tmp_path):
    from experiments.training.loop import Trainer
    from experiments.training.measures import catalogue as mc

    def trainer(*ov):
        return Trainer(compose_cfg([*tiny, *ov]), tmp_path), compose_cfg([*tiny, *ov])
    t, cfg = trainer("model.attention.dropout=0.3")
    m = mc.row_sums(t, cfg)
    assert m["rowsum/eval_max_dev"] < 1e-6 < m["rowsum/train_mean_dev"]
    assert m["dropout/kept_scale"] == pytest.approx(1 / 0.7, rel=1e-5)
    t, cfg = trainer("model.attention.score=additive")
    m = mc.cost_vs_dot(t, cfg, reps=1)
    assert m["cost/act_mem_ratio_vs_dot"] > 1 and m["params/extra_vs_dot"] == 2 * 16  # v_a: h * d_k
    t, cfg = trainer("model.attention.score=bilinear")
    assert mc.cost_vs_dot(t, cfg, reps=1)["params/extra_vs_dot"] == 2 * 16 * 16          # h * d_k^2
    t, cfg = trainer("model.attention.score=cosine", "model.attention.scale=none")
    assert mc.entropy_vs_uniform(t, cfg)["attn/entropy_frac_uniform"] > 0.9
