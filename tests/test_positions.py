"""Positions and decoding: rotary q, k (relative by construction, broken in bfloat16), positions of
left-padded rows, and the KV cache against the full forward under each causal alignment."""
import pytest
import torch
import torch.nn.functional as F

from attention import ModelConfig, TransformerLM
from attention.masks import causal_mask
from attention.mha import KVCache, MultiHeadAttention
from attention.rotary import apply_rope, rope_phases
from data.synthetic import IGNORE, PaddedCopyTask
from experiments.training.measures.positions import phase_error, relative_error

NEW_EXPS = ["rope_low_precision", "left_padding_positions", "causal_kv_cache"]


def lm(**kw):
    torch.manual_seed(0)
    return TransformerLM(ModelConfig(**{"vocab_size": 16, "block_size": 24, "d_model": 32, "n_layers": 2,
                                        "n_heads": 4, **kw})).eval()


# -- rotary ----------------------------------------------------------------------------------------
def test_rope_score_depends_only_on_the_offset_in_float32():
    g = torch.Generator().manual_seed(0)
    d = 16
    q, k = torch.randn(d, generator=g), torch.randn(d, generator=g)
    pos = torch.arange(0, 2000, 7)                      # many m, each against n = m - offset

    def score(m, n):
        qm = apply_rope(q.expand(1, 1, len(m), d), rope_phases(m, d))[0, 0]
        kn = apply_rope(k.expand(1, 1, len(n), d), rope_phases(n, d))[0, 0]
        return (qm * kn).sum(-1)
    for offset in (0, 1, 5, 40):
        s = score(pos + offset, pos)
        assert float((s - s[0]).abs().max()) < 2e-4 * float(q.norm() * k.norm())  # float32 phases up to ~2000 rad
    assert float((score(pos + 1, pos) - score(pos + 2, pos)).abs().max()) > 0.1     # the offset does matter
    torch.testing.assert_close(apply_rope(q.expand(1, 1, 1, d), rope_phases(torch.tensor([3]), d)).norm(),
                               q.norm())                                            # a rotation


def test_rope_bfloat16_phase_error_grows_with_position():
    d = 16
    f32 = [float(phase_error(torch.arange(s, s + 64), d, "float32").max()) for s in (0, 256, 4096)]
    bf16 = [float(phase_error(torch.arange(s, s + 64), d, "bfloat16").max()) for s in (0, 256, 4096)]
    assert max(f32) < 1e-3
    assert bf16[0] < 0.1 < bf16[1] < bf16[2]
    assert bf16[1] == pytest.approx(1.0) and bf16[2] == pytest.approx(16.0)  # positions round to 2, 32
    assert relative_error(4096, 64, d, "float32") < 1e-4 < 0.05 < relative_error(4096, 64, d, "bfloat16")


@pytest.mark.parametrize("backend,n_kv_heads", [("explicit", None), ("sdpa", None), ("sdpa", 2), ("explicit", 1)])
def test_rope_cached_decoding_matches_the_full_forward(backend, n_kv_heads):
    model = lm(pos="rope", n_kv_heads=n_kv_heads, attention={"backend": backend})
    assert model.pos_emb is None
    x = torch.randint(0, 16, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(x)
        cache = KVCache(2)
        inc = torch.cat([model(x[:, :7], cache=cache)] + [model(x[:, t:t + 1], cache=cache) for t in range(7, 20)], 1)
    torch.testing.assert_close(inc, full, atol=1e-5, rtol=0)
    assert torch.equal(model.generate(x[:, :6], 10), model.generate(x[:, :6], 10, use_cache=False))


def test_rope_window_placement_changes_nothing_in_float32_but_does_in_bfloat16():
    x = torch.randint(0, 16, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        m = lm(pos="rope", qk_gain=8.0)                 # sharp attention: positions matter
        torch.testing.assert_close(m(x, start=1000), m(x), atol=1e-4, rtol=0)
        m = lm(pos="rope", qk_gain=8.0, attention={"rope_dtype": "bfloat16"})
        assert float((m(x, start=1000) - m(x)).abs().max()) > 1e-2


# -- left padding ----------------------------------------------------------------------------------
def test_right_padding_holds_the_same_rows_and_targets():
    left = PaddedCopyTask(16, 21, 3, 10, seed=0).batch(0, 16)
    right = PaddedCopyTask(16, 21, 3, 10, seed=0, pad_side="right").batch(0, 16)
    for i in range(16):
        kl, kr = left.key_padding_mask[i], right.key_padding_mask[i]
        assert kr[0] and not kl[0] and kr.sum() == kl.sum() + 1           # right: the last a_L is input too
        assert torch.equal(left.x[i][kl], right.x[i][kr][:-1])
        assert torch.equal(left.y[i][left.y[i] != IGNORE], right.y[i][right.y[i] != IGNORE])
        for name in ("copy", "first_half"):
            assert torch.equal(left.y[i][left.groups[name][i]], right.y[i][right.groups[name][i]])
    assert (right.key_padding_mask.int().diff(dim=1) <= 0).all()


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_left_and_right_padding_agree_with_positions_from_the_first_token(pos):
    """Learned absolute positions need them counted from the first real token; rotary scores see
    offsets only, so with the padding masked either rule gives the right-padded logits."""
    left = PaddedCopyTask(16, 21, 3, 10, seed=0).batch(0, 8)
    right = PaddedCopyTask(16, 21, 3, 10, seed=0, pad_side="right").batch(0, 8)

    def real_logits(model, b):  # the logits of the scored targets, in order
        with torch.no_grad():
            out = model(b.x, key_padding_mask=b.key_padding_mask)
        return [out[i][b.y[i] != IGNORE] for i in range(8)]
    for rule, agree in (("from_first_token", True), ("from_padding", pos == "rope")):
        m = lm(pos=pos, pad_positions=rule)
        diff = max(float((a - b).abs().max()) for a, b in zip(real_logits(m, left), real_logits(m, right)))
        assert (diff < 1e-5) == agree, (rule, diff)


# -- causal alignment and the KV cache -------------------------------------------------------------
def test_sdpa_is_causal_aligns_top_left_when_queries_are_fewer_than_keys():
    """What this torch does (pytorch #108108): is_causal=True with T_q != T_k masks as
    tril(ones(T_q, T_k)), top-left; a decoded query needs the lower-right mask."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 2, 3, 8, generator=g), torch.randn(1, 2, 7, 8, generator=g), torch.randn(1, 2, 7, 8, generator=g)
    flag = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    top = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(3, 7, align="top_left"))
    lower = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(3, 7))
    torch.testing.assert_close(flag, top)
    assert float((flag - lower).abs().max()) > 0.1
    assert causal_mask(1, 4, align="top_left").tolist() == [[True, False, False, False]]


@pytest.mark.parametrize("backend", ["explicit", "sdpa"])
@pytest.mark.parametrize("align,agrees", [("lower_right", True), ("top_left", False)])
def test_cached_decoding_agrees_with_the_full_forward_only_lower_right(backend, align, agrees):
    model = lm(attention={"backend": backend, "causal_align": align})
    x = torch.randint(0, 16, (4, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(x)
        cache = KVCache(2)
        inc = torch.cat([model(x[:, :10], cache=cache)] + [model(x[:, t:t + 1], cache=cache) for t in range(10, 20)], 1)
    diff = float((inc - full).abs().max())
    assert float((inc[:, :10] - full[:, :10]).abs().max()) < 1e-5  # the prefill (T_q == T_k) agrees either way
    assert (diff < 1e-5) == agrees, diff
    if agrees:
        assert torch.equal(model.generate(x[:, :10], 10), model.generate(x[:, :10], 10, use_cache=False))


def test_mha_rope_uses_the_cache_offset():
    torch.manual_seed(0)
    m = MultiHeadAttention(d_model=16, n_heads=2, rope=True, backend="explicit")
    x = torch.randn(1, 6, 16)
    with torch.no_grad():
        full, _ = m(x, x, x, is_causal=True)
        cache = KVCache(1)
        a, _ = m(x[:, :4], x[:, :4], x[:, :4], is_causal=True, cache=cache)
        b, _ = m(x[:, 4:], x[:, 4:], x[:, 4:], is_causal=True, cache=cache)
    torch.testing.assert_close(torch.cat([a, b], 1), full, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="even"):
        MultiHeadAttention(d_model=6, n_heads=2, rope=True)


# -- the overlays ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NEW_EXPS)
def test_new_overlay_composes_and_passes_preflight(name, compose_cfg, tmp_path):
    from experiments.training.runner import control_config, preflight
    cfg = compose_cfg([f"+exp={name}", "logger=none"], results_dir=tmp_path)
    e = cfg["exp"]
    assert e["name"] == name and e["claim"] and e["expect"] and e["control"]["overrides"]
    assert "#" in e["claim"]                               # names the issue thread it comes from
    preflight(cfg)
    assert control_config(cfg)["model"] != cfg["model"]


def test_measures_on_a_tiny_untrained_model(compose_cfg, tiny, tmp_path):
    from experiments.training.loop import Trainer
    from experiments.training.measures import positions as mp

    def trainer(*ov):
        cfg = compose_cfg([*tiny, *ov])
        return Trainer(cfg, tmp_path), cfg
    t, cfg = trainer("model.attention.causal_align=top_left")
    m = mp.cache_agreement(t, cfg, n_rows=2)
    assert m["cache/max_abs_logit_diff"] > 1e-3 and m["cache/max_abs_logit_diff_prefill"] < 1e-5
    t, cfg = trainer("model.pos=rope", "model.attention.rope_dtype=bfloat16")
    m = mp.rope_precision(t, cfg)
    assert m["rope/phase_err@4096"] >= 8 and m["rope/rel_err@0"] < m["rope/rel_err@4096"]
    t, cfg = trainer("data=padded_copy", "data.seq_len=15", "data.max_len=7", "model.pad_positions=from_first_token")
    assert mp.padding_sides(t, cfg)["pad/abs_left_minus_right"] < 1e-5
