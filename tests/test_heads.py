"""Heads, d_v != d_k, shared keys/values (issue 4): parameter counts, the KV cache, incremental
decoding, GQA against MHA and SDPA, the two_facts task and the measurements wired into runs."""
import json

import pytest
import torch

from attention import AttentionConfig, KVCache, ModelConfig, MultiHeadAttention, TransformerLM
from attention.diagnostics import kv_cache_bytes
from data.synthetic import IGNORE, TwoFactsTask
from experiments.training.measures.heads import attention_params_formula

D = 32


def lm(**kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=20, block_size=16, d_model=D, n_layers=2, n_heads=4)
    return TransformerLM(ModelConfig(**{**cfg, **kw})).eval()


@pytest.mark.parametrize("bias", [True, False])
def test_attention_params_equal_across_heads(bias):
    counts = {h: sum(p.numel() for p in MultiHeadAttention(d_model=D, n_heads=h, bias=bias).parameters())
              for h in (1, 2, 4, 8, 16, 32)}
    assert set(counts.values()) == {4 * D * D + 4 * D * bias}


@pytest.mark.parametrize("h,h_kv,d_v", [(4, 4, 4), (4, 4, 16), (4, 2, 8), (4, 1, 8)])
def test_param_formula_with_dv_and_kv_heads(h, h_kv, d_v):
    m = MultiHeadAttention(d_model=D, n_heads=h, n_kv_heads=h_kv, d_v=d_v)
    assert sum(p.numel() for p in m.parameters()) == attention_params_formula(D, h, h_kv, D // h, d_v, True)
    assert m.W_o.in_features == h * d_v
    out, _ = m(torch.randn(2, 5, D), torch.randn(2, 5, D), torch.randn(2, 5, D))
    assert out.shape == (2, 5, D)


@pytest.mark.parametrize("h,h_kv,msg", [(4, 3, "n_kv_heads=3"), (4, 8, "n_kv_heads=8"), (4, 0, "n_kv_heads=0")])
def test_invalid_kv_heads_rejected(h, h_kv, msg):
    with pytest.raises(ValueError, match=msg) as e:
        AttentionConfig(d_model=D, n_heads=h, n_kv_heads=h_kv)
    assert "\n" not in str(e.value)


def test_gqa_with_all_kv_heads_is_mha_exactly():
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=D, n_heads=4, backend="explicit")
    gqa = MultiHeadAttention(d_model=D, n_heads=4, n_kv_heads=4, backend="explicit")
    gqa.load_state_dict(mha.state_dict())
    x = torch.randn(2, 7, D)
    assert torch.equal(mha(x, x, x, is_causal=True)[0], gqa(x, x, x, is_causal=True)[0])


def test_gqa_equals_mha_with_repeated_kv_weights():
    """Query head i reads kv head i // (h / h_kv): an MHA whose K/V weights repeat the shared ones."""
    torch.manual_seed(0)
    gqa = MultiHeadAttention(d_model=D, n_heads=4, n_kv_heads=2, backend="explicit")
    mha = MultiHeadAttention(d_model=D, n_heads=4, backend="explicit")
    sd = gqa.state_dict()
    for w in ("W_k", "W_v"):
        for p in ("weight", "bias"):
            t = sd[f"{w}.{p}"]
            sd[f"{w}.{p}"] = t.view(2, -1, *t.shape[1:]).repeat_interleave(2, 0).reshape(-1, *t.shape[1:])
    mha.load_state_dict(sd)
    x = torch.randn(2, 7, D)
    torch.testing.assert_close(gqa(x, x, x, is_causal=True)[0], mha(x, x, x, is_causal=True)[0],
                               atol=1e-6, rtol=0)


@pytest.mark.parametrize("h_kv", [2, 1])
def test_gqa_explicit_matches_sdpa_forward_and_backward(h_kv):
    torch.manual_seed(0)
    ex = MultiHeadAttention(d_model=D, n_heads=4, n_kv_heads=h_kv, backend="explicit")
    sd = MultiHeadAttention(d_model=D, n_heads=4, n_kv_heads=h_kv, backend="sdpa")
    sd.load_state_dict(ex.state_dict())
    x1 = torch.randn(2, 9, D, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    o1, o2 = ex(x1, x1, x1, is_causal=True)[0], sd(x2, x2, x2, is_causal=True)[0]
    torch.testing.assert_close(o1, o2, atol=1e-5, rtol=0)
    o1.square().sum().backward()
    o2.square().sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, atol=1e-5, rtol=0)
    torch.testing.assert_close(ex.W_k.weight.grad, sd.W_k.weight.grad, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kw", [{}, {"n_kv_heads": 2}, {"n_kv_heads": 1}, {"attention": {"d_v": 16}},
                                {"attention": {"backend": "explicit"}, "n_kv_heads": 1}])
def test_incremental_decoding_matches_full_forward(kw):
    model = lm(**kw)
    idx = torch.randint(0, 20, (3, 12))
    with torch.no_grad():
        full = model(idx)
        cache = KVCache(2)
        steps = [model(idx[:, :5], cache=cache)] + [model(idx[:, t:t + 1], cache=cache) for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    assert cache.length == 12


def test_generate_uses_cache_consistently():
    model = lm(n_kv_heads=1)
    prompt = torch.randint(0, 20, (2, 4))
    out = model.generate(prompt, 6)
    assert out.shape == (2, 10) and torch.equal(out[:, :4], prompt)
    with torch.no_grad():  # greedy: every new token is the argmax of the full forward on its prefix
        for t in range(4, 10):
            assert torch.equal(model(out[:, :t])[:, -1].argmax(-1), out[:, t])


@pytest.mark.parametrize("h_kv", [4, 2, 1])
def test_kv_cache_bytes_from_tensors_equal_formula(h_kv):
    model = lm(n_kv_heads=h_kv)
    cache = KVCache(2)
    with torch.no_grad():
        model(torch.randint(0, 20, (1, 13)), cache=cache)
    assert cache.nbytes() == 2 * 2 * h_kv * (D // 4) * 13 * 4 == kv_cache_bytes(2, h_kv, D // 4, 13, 4)
    assert kv_cache_bytes(2, 4, D // 4, 13, 4) // cache.nbytes() == 4 // h_kv  # MQA: h times smaller


def test_two_facts_task_answers_ordered_pair():
    t = TwoFactsTask(n_values=5, n_noise=6, seq_len=13, max_copies=3, seed=1)
    b, b2 = t.batch(3, 64), t.batch(3, 64)
    assert torch.equal(b.x, b2.x) and not torch.equal(b.x, t.batch(4, 64).x)
    assert t.vocab_size == 2 * 5 + 6 + 1 + 25 and b.x.max() < t.vocab_size
    facts = t.fact_masks(b.x)
    counts = facts.sum(-1)
    assert counts.min() >= 1 and counts.max() <= 3 and counts.max() == 3
    a = torch.where(facts[:, 0], b.x, 99).min(1).values
    bb = torch.where(facts[:, 1], b.x, 99).min(1).values
    assert ((torch.where(facts[:, 0], b.x, a[:, None]) == a[:, None]).all())  # copies of one value
    assert torch.equal(b.y[:, -1], t.answer0 + a * 5 + bb)
    assert (b.y[:, :-1] == IGNORE).all() and b.groups["answer"][:, -1].all()
    assert (b.x[:, -1] == t.query).all()
    assert t.average_ceiling == pytest.approx(6 / 10)


def test_two_facts_unordered_and_disjoint_variants():
    t = TwoFactsTask(n_values=4, seq_len=11, ordered=False, shared_values=False)
    b = t.batch(0, 256)
    facts = t.fact_masks(b.x)
    second = torch.where(facts[:, 1], b.x, 99).min(1).values
    assert (second >= 4).all() and (second < 8).all()  # b has its own tokens
    pair = b.y[:, -1] - t.answer0
    assert (pair // 4 <= pair % 4).all()  # the unordered pair: (min, max)
    assert t.average_ceiling == 1.0


@pytest.mark.parametrize("kw,field", [({"max_copies": 99}, "data.max_copies"), ({"n_values": 1}, "data.n_values"),
                                      ({"vocab_size": 7}, "data.vocab_size"), ({"seq_len": 2}, "data.max_copies")])
def test_two_facts_bad_config(kw, field):
    with pytest.raises(ValueError, match=field):
        TwoFactsTask(**kw)


@pytest.mark.parametrize("exp,key,values", [("heads", "model.n_heads", "1,2,4,8,16,32"),
                                             ("kv_sharing", "model.n_kv_heads", "2,1"),
                                             ("dv_ne_dk", "model.attention.d_v", "8,32")])
def test_exp_presets_compose_with_their_sweep(exp, key, values):
    from experiments.config import compose_config
    cfg = compose_config([f"+exp={exp}"], return_hydra_config=True)
    assert cfg.exp.name == exp and cfg.hydra.sweeper.params[key] == values
    if exp == "heads":
        assert cfg.data.name == "two_facts" and cfg.model.n_layers == 1


def test_runs_record_measurements(compose_cfg, tiny, tmp_path):
    """A tiny heads run and a tiny kv_sharing run: the measurements land in summary.json."""
    from experiments.training.runner import run_experiment
    small = [o for o in tiny if not o.startswith(("data.", "model.n_heads"))]
    cfg = compose_cfg(["+exp=heads", *small, "data.seq_len=9", "data.n_values=3", "model.n_heads=2"], tmp_path)
    s = run_experiment(cfg, tmp_path / "heads")
    f = json.loads((tmp_path / "heads" / "summary.json").read_text())["final"]
    assert f["params/attention"] == f["params/attention_4d2"] == 4 * 32 * 32 + 4 * 32
    assert 0 <= f["attn/fact_a"] <= 1 and 0 <= f["attn/fact_b"] <= 1 and 0 <= f["attn/split"] <= 1
    assert f["acc/answer_above_average"] == pytest.approx(f["acc/answer"] - 4 / 6)
    assert s.verdict["checks"][0]["passed"]

    cfg = compose_cfg(["+exp=kv_sharing", *tiny, "model.n_kv_heads=1"], tmp_path)
    s = run_experiment(cfg, tmp_path / "kv")
    f = s.final
    assert f["kv/bytes"] == f["kv/bytes_formula"] == 2 * 1 * 1 * 16 * 15 * 4
    assert f["kv/mha_over_this"] == 2 and f["decode/ms_per_token"] > 0
    assert s.control["final"]["kv/bytes"] == 2 * f["kv/bytes"]  # the MHA control measured too
    names = {c["name"]: c["passed"] for c in s.verdict["checks"]}
    assert names["cache bytes = 2 L n_kv d_k T bytes"] and names["cache n_heads/n_kv_heads times smaller than MHA"]


def _summary(exp, h, seed, final, **kw):
    cfg = {"data": {"max_copies": 4, "ordered": True, "shared_values": True, "n_values": 8},
           "model": {"n_heads": h, "n_layers": 1, "d_model": 32}, "train": {"steps": 800}}
    from experiments.records import RunRecord
    return RunRecord(exp=exp, status="completed", seed=seed, final=final, config=cfg, **kw)


def test_heads_section_computes_its_statements(tmp_path):
    from experiments.report.sections import heads
    runs = []
    for h, acc in [(1, 0.55), (2, 0.99), (4, 1.0), (8, 1.0), (16, 0.9), (32, 0.5)]:
        for seed in (0, 1):
            runs.append(_summary("heads", h, seed, {
                "acc/answer": acc, "loss/answer": 1 - acc, "loss/train": 1 - acc, "attn/fact_a": 0.5,
                "attn/fact_b": 0.45, "attn/split": 0.9 if h == 1 else 0.0, "attn/separated": float(h > 1),
                "acc/average_ceiling": 9 / 16, "params/attention": 4 * 32 * 32 + 4 * 32}))
    md = heads.render(runs, tmp_path)
    assert "| 1 | 32 | 4224 | 0.55 ± 0 | 0.45 ± 0 | 1.57 ± 0 | 5.29 |" in md
    assert "**one head fails by interference**" in md and "about 50/50" in md
    assert "Smallest d_k (1, h=32)" in md and "it hurts" in md and "identical across h" in md
    assert (tmp_path / "heads_0.png").exists()
    runs[0].final["acc/answer"] = runs[1].final["acc/answer"] = 0.9
    assert "does not fail by interference here" in heads.render(runs, tmp_path)
    assert heads.render([_summary("baseline", 4, 0, {})], tmp_path) is None
