"""Catalogue II at the unit level: the bugs practitioners file issues about, each toggle doing
exactly its damage, and every new conf/exp overlay composing and passing preflight."""
import pytest
import torch

from attention import MultiHeadAttention
from attention.masks import MASKED_BIAS, apply_mask, causal_mask, combine_masks, padding_mask

ISSUES = ["finite_mask_leak", "causal_off_by_one", "mask_min_overflow", "qk_fp16_overflow"]


def mha(**kw):
    torch.manual_seed(0)
    return MultiHeadAttention(**{"d_model": 16, "n_heads": 2, "backend": "explicit", **kw})


def x_in(B=2, T=4, d=16, seed=1):
    return torch.randn(B, T, d, generator=torch.Generator().manual_seed(seed))


# -- finite_mask_leak ----------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["explicit", "sdpa"])
def test_added_minus_1e4_lets_a_future_score_beyond_1e4_win(backend):
    m = mha(mask_fill="add_minus_1e4", backend=backend)
    q = torch.zeros(1, 1, 2, 4)
    k = torch.zeros(1, 1, 2, 4)
    v = torch.tensor([[[[1.0], [2.0]]]])
    mask = causal_mask(2)
    s = m.scale_factor()
    q[..., 0, 0], k[..., 1, 0] = 1.0, (abs(MASKED_BIAS) + 100) / s  # query 0: own score 0, future 1e4 + 100
    if backend == "explicit":
        out, w = m.attend(q, k, v, mask)
        assert float(w[0, 0, 0, 1]) == pytest.approx(1.0)        # the masked future key wins
    else:
        out = m._sdpa(q, k, v, mask, False)
    assert float(out[0, 0, 0, 0]) == pytest.approx(2.0)           # query 0 read the future value
    replaced, _ = mha(mask_fill="minus_1e4").attend(q, k, v, mask)
    assert float(replaced[0, 0, 0, 0]) == pytest.approx(1.0)      # replaced: the fill caps it
    k[..., 1, 0] = (abs(MASKED_BIAS) - 100) / s                   # margin below 1e4: no leak
    out, w = m.attend(q, k, v, mask)
    assert float(w[0, 0, 0, 1]) < 1e-6



def test_added_minus_1e4_trains_the_same_on_every_backend():
    """A training forward (no recorder, backend auto) must not hand the causal mask to SDPA's own
    flag, whose -inf fill would hide the leak the -1e4 fill lets through."""
    torch.manual_seed(0)
    layers = {b: mha(mask_fill="add_minus_1e4", backend=b, d_model=4, n_heads=1, bias=False)
              for b in ("auto", "explicit")}
    layers["neg_inf"] = mha(mask_fill="neg_inf", d_model=4, n_heads=1, bias=False)
    for m in layers.values():
        for w in (m.W_q, m.W_k, m.W_v, m.W_o):
            torch.nn.init.eye_(w.weight)
    x = 300 * x_in(B=2, T=6, d=4)                                  # scores ~1e4-1e5: some pass the fill
    out = {b: m(x, x, x, is_causal=True)[0] for b, m in layers.items()}
    assert torch.allclose(out["auto"], out["explicit"], atol=1e-3)
    assert not torch.allclose(out["auto"], out["neg_inf"], atol=1e-3)  # the future leaked in

def test_replaced_minus_1e4_leaks_once_every_visible_score_is_below_it():
    m = mha(mask_fill="minus_1e4")
    q, k = torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 3, 4)
    v = torch.tensor([[[[1.0], [2.0], [3.0]]]])
    q[..., 0, 0], k[..., 0, 0] = 1.0, -(abs(MASKED_BIAS) + 100) / m.scale_factor()  # own score -1e4 - 100
    _, w = m.attend(q, k, v, causal_mask(3))
    torch.testing.assert_close(w[0, 0, 0], torch.tensor([0.0, 0.5, 0.5]))  # uniform over the future


# -- causal_off_by_one ---------------------------------------------------------------------------
def test_off_by_one_masks_the_diagonal():
    ok, bug = causal_mask(4), causal_mask(4, causal="off_by_one")
    assert ok.diagonal().all() and not bug.diagonal().any()
    assert torch.equal(bug, ok & ~torch.eye(4, dtype=torch.bool))
    x = x_in()
    _, w = mha(causal="off_by_one")(x, x, x, is_causal=True, need_weights=True)
    torch.testing.assert_close(w[:, :, 0], torch.full_like(w[:, :, 0], 0.25))  # row 0: every key
    assert (w.diagonal(dim1=-2, dim2=-1)[..., 1:] == 0).all()
    out, _ = mha(causal="off_by_one", mask_fill="neg_inf")(x, x, x, is_causal=True)
    assert torch.isnan(out[:, 0]).all() and torch.isfinite(out[:, 1:]).all()
    sdpa = MultiHeadAttention(mha(causal="off_by_one").cfg, backend="sdpa")
    sdpa.load_state_dict(mha(causal="off_by_one").state_dict())
    torch.testing.assert_close(sdpa(x, x, x, is_causal=True)[0], mha(causal="off_by_one")(x, x, x, is_causal=True)[0])


# -- mask_min_overflow ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_add_min_overflows_where_both_masks_hide_a_key(dtype):
    kpm = padding_mask(torch.tensor([2]), 4, left=True)               # [F, F, T, T]
    c = causal_mask(4)
    add = combine_masks(c, kpm, combine="add_min", dtype=dtype)
    both = ~c & ~kpm[:, None, None, :]
    assert torch.isneginf(add[both]).all() and not torch.isneginf(add[~both]).any()
    assert torch.equal(add == 0, combine_masks(c, kpm))               # the same visible keys
    assert not torch.isneginf(add).all(-1).any()                       # no row all -inf: key 0 is single


def test_add_min_in_float16_turns_a_negative_score_into_minus_inf():
    kpm = padding_mask(torch.tensor([2]), 4, left=True)
    c = causal_mask(4)
    scores = torch.full((1, 1, 4, 4), -20.0, dtype=torch.float16)     # < -16: min + s overflows
    for combine, nan_rows in (("add_min", True), ("logical_and", False)):
        mask = combine_masks(c, kpm, combine=combine, dtype=torch.float16)
        w = torch.softmax(apply_mask(scores, mask, "finite").float(), -1)
        assert bool(torch.isnan(w[0, 0, :2]).all()) == nan_rows       # the padded queries
        assert torch.isfinite(w[0, 0, 2:]).all()
    x = x_in(1, 4)                                                     # through the layer, float32
    out = {c: mha(mask_combine=c)(x, x, x, is_causal=True, key_padding_mask=kpm)[0]
           for c in ("add_min", "logical_and")}
    # real queries agree; a padded query's row, all masked, averages over different keys
    torch.testing.assert_close(out["add_min"][:, 2:], out["logical_and"][:, 2:])
    assert not torch.allclose(out["add_min"][:, :2], out["logical_and"][:, :2])


# -- qk_fp16_overflow ----------------------------------------------------------------------------
def test_fp16_matmul_then_scale_overflows_where_upcast_does_not():
    q = torch.full((1, 1, 2, 64), 40.0)
    k = torch.full((1, 1, 2, 64), 40.0)                                # q.k = 102400 > 65504
    bug, fix = mha(upcast=False), mha(upcast=True)
    with torch.autocast("cpu", dtype=torch.float16):
        s_bug, s_fix = bug.scores(q, k), fix.scores(q, k)
    assert torch.isinf(s_bug).all() and s_fix.dtype == torch.float32
    assert torch.isfinite(s_fix).all() and float(s_fix.max()) == pytest.approx(102400 * fix.scale_factor())
    q, k = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)            # float32: both orders agree
    torch.testing.assert_close(bug.scores(q, k), fix.scores(q, k), rtol=1e-5, atol=1e-5)
    x = x_in()
    fix.load_state_dict(bug.state_dict())
    torch.testing.assert_close(bug(x, x, x, is_causal=True)[0], fix(x, x, x, is_causal=True)[0])
    with pytest.raises(ValueError, match="upcast"):
        mha(upcast=True, score="additive")



def test_only_a_positive_product_past_65504_is_the_overflow():
    """Issue 64: float16 turns a negative q.k past -65504 into -inf (a zero weight), a positive one
    into +inf (a NaN row). The check reads the largest positive q.k a query sees, not |q.k|."""
    from experiments.training.measures.catalogue import max_visible_qk
    q = torch.full((1, 1, 2, 64), 40.0)
    k = torch.stack([torch.full((64,), -40.0), torch.full((64,), 40.0)])[None, None]   # q.k = -102400, +102400
    mask = causal_mask(2)                                            # query 0 sees key 0 only
    assert max_visible_qk(q, k, mask) == 102400.0                    # query 1 sees the positive product
    assert max_visible_qk(q[..., :1, :], k, mask[..., :1, :]) == -102400.0   # |q.k| is large, the product negative
    with torch.autocast("cpu", dtype=torch.float16):
        s = mha(upcast=False).scores(q[..., :1, :], k[..., :1, :])
    assert torch.isneginf(s).all() and float(torch.softmax(torch.cat([s, torch.zeros_like(s)], -1), -1)[..., 0]) == 0.0

# -- fully_masked_rows: which behaviour each backend has on the installed torch ------------------
@pytest.mark.parametrize("backend", ["explicit", "sdpa"])
def test_fully_masked_row_behaviour_per_backend_on_this_torch(backend):
    """The explicit path's -inf row is exp(-inf) / 0 = NaN on any version; SDPA's fused CPU
    kernel returns 0 for it since torch 2.5 (pytorch PR #133882, #141128). Stated for the
    installed torch: a new version that changes this fails here."""
    x = x_in(1, 4)
    kpm = torch.tensor([[False, False, True, True]])                  # left padding: rows 0, 1 empty
    m = MultiHeadAttention(d_model=16, n_heads=2, backend=backend, mask_fill="neg_inf")
    q = k = v = m.split_heads(x, 2, 8)
    mask = combine_masks(causal_mask(4), kpm)
    out = m.attend(q, k, v, mask)[0] if backend == "explicit" else m._sdpa(q, k, v, mask, False)
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if backend == "explicit" or version < (2, 5):
        assert torch.isnan(out[0, :, :2]).all()
    else:
        assert (out[0, :, :2] == 0).all()
    assert torch.isfinite(out[0, :, 2:]).all()


# -- the overlays ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ISSUES)
def test_issue_overlay_composes_and_passes_preflight(name, compose_cfg, tmp_path):
    from experiments.training.runner import control_config, preflight
    cfg = compose_cfg([f"+exp={name}", "logger=none"], results_dir=tmp_path)
    e = cfg["exp"]
    assert e["name"] == name and e["claim"] and e["expect"] and e["control"]["overrides"]
    preflight(cfg)
    assert control_config(cfg)["model"] != cfg["model"]


def test_issue_measures_on_a_tiny_untrained_model(compose_cfg, tiny, tmp_path):
    from experiments.training.loop import Trainer
    from experiments.training.measures import catalogue as mc

    def trainer(*ov):
        cfg = compose_cfg([*tiny, *ov])
        return Trainer(cfg, tmp_path), cfg
    t, cfg = trainer("model.attention.mask_fill=add_minus_1e4")
    m = mc.mask_leak(t, cfg)                           # small scores: no leak, same losses
    assert m["leak/fill"] == -1e4 and m["leak/masked_mass_max"] < 1e-6
    assert m["leak/max_hidden_margin"] < 1e4 and m["leak/min_visible_score"] > -1e4
    assert m["leak/loss/copy_correct_mask"] == pytest.approx(t.evaluate(1)["loss/copy"], rel=1e-4)
    t, cfg = trainer("model.attention.causal=off_by_one")
    m = mc.first_token_loss(t, cfg)
    assert m["attn/first_row_entropy_frac"] == pytest.approx(1.0, abs=1e-5)   # uniform over all keys
    t, cfg = trainer()
    assert mc.first_token_loss(t, cfg)["attn/first_row_entropy_frac"] == pytest.approx(0.0, abs=1e-5)
    t, cfg = trainer("model.attention.upcast=false")
    m = mc.fp16_attention(t, cfg)
    assert -m["fp16/max_abs_qk"] <= m["fp16/max_qk"] <= m["fp16/max_abs_qk"]
    assert 0 < m["fp16/max_abs_qk"] < 65504 and m["fp16/nonfinite_logits"] == m["fp16_other/nonfinite_logits"] == 0
    t, cfg = trainer("data=padded_copy", "data.seq_len=15", "data.max_len=7", "model.attention.mask_combine=add_min")
    m = mc.mask_combine_rows(t, cfg)
    assert m["mask32/nonfinite_logits"] == m["mask16_other/nonfinite_logits"] == 0
    assert m["mask16/neginf_rows"] == 0                 # scores near 0: min + score stays finite
