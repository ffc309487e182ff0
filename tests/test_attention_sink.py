"""A sliding-window KV cache (model.attention.kv_window, kv_sinks): in evaluation each query reads
its last kv_window keys and the first kv_sinks; in training the whole prefix. The mask path agrees
with decoding through a cache that really evicts, on both backends."""
import pytest
import torch

from attention import MultiHeadAttention
from attention.masks import causal_mask, window_mask


def test_the_window_keeps_the_last_keys_and_the_sinks():
    m = window_mask(5, 5, window=2, sinks=1) & causal_mask(5)
    assert m.int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0],
                                [1, 0, 1, 1, 0], [1, 0, 0, 1, 1]]              # the last 2 keys, and key 0
    decoding = window_mask(2, 6, window=2) & causal_mask(2, 6)                 # 2 new queries after 4 cached keys
    assert decoding.int().tolist() == [[0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1]]


def evicting_decode(m: MultiHeadAttention, x: torch.Tensor, window: int, sinks: int) -> torch.Tensor:
    """One token at a time through a KV cache that keeps the first `sinks` tokens and the last
    `window` (StreamingLLM's cache), attention computed by hand from the cached keys and values."""
    outs = []
    for t in range(x.shape[1]):
        kept = sorted(set(range(min(sinks, t + 1))) | set(range(max(0, t - window + 1), t + 1)))
        q = m.split_heads(m.W_q(x[:, t:t + 1]), m.n_heads, m.d_k)              # (B, h, 1, d_k)
        k = m.split_heads(m.W_k(x[:, kept]), m.n_heads, m.d_k)                 # (B, h, kept, d_k)
        v = m.split_heads(m.W_v(x[:, kept]), m.n_heads, m.d_v)
        w = torch.softmax(q @ k.transpose(-2, -1) / m.d_k ** 0.5, dim=-1)
        outs.append(m.W_o((w @ v).transpose(1, 2).reshape(x.shape[0], 1, -1)))
    return torch.cat(outs, 1)


@pytest.mark.parametrize("backend", ["explicit", "sdpa"])
@pytest.mark.parametrize("sinks", [0, 4])
def test_evaluation_attends_as_a_cache_that_evicts(backend, sinks):
    torch.manual_seed(0)
    m = MultiHeadAttention(d_model=16, n_heads=2, backend=backend, kv_window=3, kv_sinks=sinks).eval()
    x = torch.randn(2, 10, 16)
    with torch.no_grad():
        out, _ = m(x, x, x, is_causal=True)
        torch.testing.assert_close(out, evicting_decode(m, x, 3, sinks), atol=1e-5, rtol=0)


def test_training_attends_to_the_whole_prefix():
    torch.manual_seed(0)
    windowed = MultiHeadAttention(d_model=16, n_heads=2, kv_window=3)
    full = MultiHeadAttention(d_model=16, n_heads=2)
    full.load_state_dict(windowed.state_dict())
    x = torch.randn(2, 10, 16)
    torch.testing.assert_close(windowed(x, x, x, is_causal=True)[0], full(x, x, x, is_causal=True)[0])
    assert not torch.allclose(windowed.eval()(x, x, x, is_causal=True)[0], full.eval()(x, x, x, is_causal=True)[0])


@pytest.mark.usefixtures("corpus")
def test_the_measure_serves_a_cache_twice_as_large_on_the_same_weights(tmp_path):
    """window_eviction's eviction_cost_x2 (the condition a reliable signature may need, issue 47)
    is what the measure reads when the served cache itself is twice as large: two paths, one number."""
    import copy
    import dataclasses

    from experiments.config import compose
    from experiments.training.loop import Trainer
    from experiments.training.measures.positions import window_eviction
    cfg = compose(["+exp=attention_sink", "model.d_model=32", "model.n_layers=1", "model.n_heads=2",
                   "model.attention.kv_window=6", "model.attention.kv_sinks=2", "train.steps=1", "train.batch_size=4",
                   "train.eval_batches=2", "logger=none", f"results_dir={tmp_path}"])
    trainer = Trainer(cfg, tmp_path / "run")
    trainer.run()
    out = window_eviction(trainer, cfg)
    assert set(out) >= {"window/eviction_cost", "window/eviction_cost_x2"} and out["window/agreement_before_full"] < 1e-5
    big = copy.deepcopy(cfg)
    big["model"]["attention"]["kv_window"] = 6 + 8   # as many sinks, the rest recent: 16 keys
    for a in trainer.model.attentions:
        a.cfg = dataclasses.replace(a.cfg, kv_window=14)
    assert window_eviction(trainer, big)["window/eviction_cost"] == pytest.approx(out["window/eviction_cost_x2"], abs=1e-6)
