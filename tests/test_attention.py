"""The attention library: the explicit path is the reference, SDPA must agree with it; the
lesson's worked numbers come out of the package's own functions."""
import math

import pytest
import torch

from attention import AttentionConfig, ModelConfig, MultiHeadAttention, TransformerLM
from attention.diagnostics import Recorder, entropy, hull_violation, saturated_fraction, softmax_jacobian_diag
from attention.masks import causal_mask, padding_mask
from attention.softmax import normalize_by_sum, softmax_naive, softmax_stable

D = 32


def _pair(**kw):
    """The same weights under both backends."""
    torch.manual_seed(0)
    ex = MultiHeadAttention(d_model=D, backend="explicit", **kw)
    sd = MultiHeadAttention(d_model=D, backend="sdpa", **kw)
    sd.load_state_dict(ex.state_dict())
    return ex, sd


CASES = [
    dict(n_heads=1), dict(n_heads=4), dict(n_heads=8),
    dict(n_heads=4, d_v=16), dict(n_heads=2, d_k=8, d_v=24),
    dict(n_heads=4, scale="none"), dict(n_heads=4, scale=0.3), dict(n_heads=4, scale="learned"),
    dict(n_heads=4, n_kv_heads=2), dict(n_heads=4, n_kv_heads=1),
    dict(n_heads=4, qk_norm=True), dict(n_heads=4, score="cosine", scale="learned"),
    dict(n_heads=2, score="bilinear"),
]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
@pytest.mark.parametrize("masking", ["causal", "causal+padding", "none"])
def test_explicit_and_sdpa_agree_forward_and_backward(kw, masking):
    ex, sd = _pair(**kw)
    torch.manual_seed(1)
    B, T = 3, 7
    x = torch.randn(B, T, D)
    mask_kw = {}
    if masking != "none":
        mask_kw["is_causal"] = True
    if masking == "causal+padding":  # right padding: no row is left without a visible key
        mask_kw["key_padding_mask"] = padding_mask(torch.tensor([7, 5, 3]), T, left=False)
    outs, grads = [], []
    for m in (ex, sd):
        xi = x.clone().requires_grad_(True)
        out, _ = m(xi, xi, xi, **mask_kw)
        out.pow(2).sum().backward()
        outs.append(out)
        grads.append([xi.grad] + [p.grad for p in m.parameters()])
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    for g0, g1 in zip(*grads):
        torch.testing.assert_close(g0, g1, atol=1e-5, rtol=1e-5)


def test_rows_of_weights_sum_to_one_in_eval_mode():
    m = MultiHeadAttention(d_model=D, n_heads=4, dropout=0.5).eval()
    x = torch.randn(2, 9, D)
    _, w = m(x, x, x, need_weights=True, is_causal=True)
    assert w.shape == (2, 4, 9, 9)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 9), atol=1e-6, rtol=0)
    assert torch.all(w.triu(1) == 0)  # causal: no weight on the future


def test_naive_softmax_overflows_where_stable_does_not():
    x = torch.tensor([100.0, 101.0, 102.0])
    assert not torch.isfinite(softmax_naive(x)).all()
    torch.testing.assert_close(softmax_stable(x), torch.tensor([0.0900, 0.2447, 0.6652]), atol=1e-4, rtol=0)
    # below the float32 exp limit (~88.7) the two agree
    torch.testing.assert_close(softmax_naive(x - 50), softmax_stable(x))


def test_normalize_by_sum_gives_negative_weights_that_still_sum_to_one():
    w = normalize_by_sum(torch.tensor([2.0, -1.0, 0.5]))
    assert (w < 0).any()
    torch.testing.assert_close(w.sum(), torch.tensor(1.0))


def test_alpha_v_is_the_lessons_convex_combination():
    alpha = softmax_stable(torch.tensor([0.074, 0.620, 0.306]).log())  # softmax of log-weights = weights
    V = torch.tensor([[2.0, 0.0], [0.0, 4.0], [1.0, 1.0]])
    out = alpha @ V
    torch.testing.assert_close(out, torch.tensor([0.454, 2.786]), atol=1e-3, rtol=0)
    assert float(hull_violation(out[None], V[None])) == 0.0


@pytest.mark.parametrize("gap,expected,rel", [(24.0, 3.8e-11, 0.05), (3.0, 0.045, 0.05)])
def test_softmax_jacobian_diagonal_vanishes_with_the_logit_gap(gap, expected, rel):
    alpha = softmax_stable(torch.tensor([gap, 0.0], dtype=torch.float64))
    d = softmax_jacobian_diag(alpha)
    assert d[0].item() == pytest.approx(expected, rel=rel)


@pytest.mark.parametrize("d_k", [16, 64, 256])
def test_unit_variance_q_k_give_score_variance_d_k(d_k):
    g = torch.Generator().manual_seed(d_k)
    q, k = torch.randn(20000, d_k, generator=g), torch.randn(20000, d_k, generator=g)
    var = (q * k).sum(-1).var().item()
    assert var == pytest.approx(d_k, rel=0.05)
    assert ((q * k).sum(-1) / math.sqrt(d_k)).var().item() == pytest.approx(1.0, rel=0.05)


def test_recorder_measures_score_std_as_the_variance_argument_predicts():
    """unit_variance init, unscaled: layer-0 score std ~ sqrt(d_k) std(q) std(k)."""
    cfg = ModelConfig(vocab_size=16, block_size=32, d_model=64, n_layers=1, n_heads=1, init="unit_variance",
                      attention={"scale": "none"})
    torch.manual_seed(0)
    lm = TransformerLM(cfg)
    rec = Recorder()
    lm.attentions[0].recorder = rec
    lm(torch.randint(0, 16, (8, 32)))
    s = rec.stats
    assert s["attn/score_std/L0"] == pytest.approx(s["attn/score_std_pred/L0"], rel=0.15)
    assert s["attn/score_std/L0"] == pytest.approx(8.0, rel=0.25)  # sqrt(64) with q, k of std ~1


def test_entropy_and_saturation():
    T = 8
    uniform = torch.full((1, 1, 1, T), 1 / T)
    assert entropy(uniform).item() == pytest.approx(math.log(T))
    onehot = torch.zeros(1, 1, 1, T)
    onehot[..., 0] = 1
    assert entropy(onehot).item() == pytest.approx(0.0, abs=1e-6)
    assert saturated_fraction(torch.cat([uniform, onehot], 2)).item() == 0.5


def test_causal_attention_does_not_see_the_future():
    m = MultiHeadAttention(d_model=D, n_heads=4)
    x = torch.randn(1, 6, D, requires_grad=True)
    out, _ = m(x, x, x, is_causal=True)
    out[0, 2].sum().backward()
    assert x.grad[0, 3:].abs().max() == 0 and x.grad[0, :3].abs().max() > 0


def test_causal_mask_offsets_for_decoding():
    assert causal_mask(1, 4).tolist() == [[True, True, True, True]]
    assert causal_mask(3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_parameter_count_is_four_d_squared_for_any_number_of_heads():
    for h in (1, 2, 4, 8, 16, 32):
        m = MultiHeadAttention(d_model=64, n_heads=h, bias=False)
        assert sum(p.numel() for p in m.parameters()) == 4 * 64 * 64


def test_sdpa_stays_fused_unless_diagnostics_or_weights_are_asked(monkeypatch):
    import torch.nn.functional as F
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    m = MultiHeadAttention(d_model=D, n_heads=4)  # backend auto -> sdpa for a stable dot product
    x = torch.randn(2, 5, D)
    m(x, x, x, is_causal=True)
    assert len(calls) == 1
    rec = m.recorder = Recorder()
    m(x, x, x, is_causal=True)
    m.recorder = None
    m(x, x, x, need_weights=True)
    assert len(calls) == 1  # diagnostics and need_weights took the explicit path
    assert rec.stats["attn/entropy/L0"] > 0


@pytest.mark.parametrize("kw,field", [
    (dict(d_model=30, n_heads=4), "n_heads"),
    (dict(d_model=32, n_heads=4, n_kv_heads=3), "n_kv_heads"),
    (dict(d_model=32, n_heads=4, d_k=0), "d_k"),
    (dict(d_model=32, n_heads=4, d_v=-1), "d_v"),
    (dict(d_model=32, softmax="fast"), "softmax"),
    (dict(d_model=32, score="dotty"), "score"),
    (dict(d_model=32, scale="sqrt"), "scale"),
    (dict(d_model=32, mask_mode="wrong"), "mask_mode"),
    (dict(d_model=32, merge="concat"), "merge"),
    (dict(d_model=32, backend="flash"), "backend"),
    (dict(d_model=32, backend="sdpa", softmax="naive"), "backend"),
    (dict(d_model=32, dropout=1.0), "dropout"),
])
def test_config_validation_names_the_field(kw, field):
    with pytest.raises(ValueError, match=field) as e:
        AttentionConfig(**kw)
    assert "\n" not in str(e.value)


def test_model_config_rejects_unknown_init_and_fields():
    with pytest.raises(ValueError, match="model.init"):
        ModelConfig(init="xavier")
    with pytest.raises(ValueError, match="unknown model field"):
        ModelConfig.from_dict({"d_modle": 64})


@pytest.mark.parametrize("init", ["gpt2", "torch_default", "unit_variance"])
def test_init_schemes_set_the_q_k_scale(init):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=256, n_layers=2, n_heads=4, init=init, qk_gain=2.0)
    w = TransformerLM(cfg).attentions[0].W_q.weight
    expected = {"gpt2": 0.02, "torch_default": 1 / math.sqrt(3 * 256), "unit_variance": 1 / math.sqrt(256)}[init]
    assert w.std().item() == pytest.approx(2.0 * expected, rel=0.05)
