"""The doctor on real code, unchanged: torch.nn.MultiheadAttention, nanoGPT's attention (as
transcribed in experiments/bench/), transformers' GPT-2 and Llama with eager and SDPA. Each
verdict other than pass is a real behaviour with its public thread (docs/doctor.md)."""
import pytest
import torch
import torch.nn as nn

from attention_doctor import TorchMHA, examine
from experiments.bench.nanogpt_reference import GPT, CausalSelfAttention


def not_passed(r):
    """Every row that is neither a pass nor n/a (an inconclusive row is one: never a pass)."""
    return {c.name: c.outcome for c in r.checks if c.outcome not in ("pass", "n/a")}


@pytest.mark.parametrize("causal", [False, True])
def test_multihead_attention_fully_masked_rows_by_need_weights(causal):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(32, 4, batch_first=True)
    r = examine(TorchMHA(mha, causal=causal), strict=True)
    # need_weights=True (its default): NaN for a row with every key masked, NaN gradients (pytorch #41508)
    assert not_passed(r) == {"fully_masked_rows": "fail"}, r.table()
    assert "return NaN" in r["fully_masked_rows"].detail
    off = TorchMHA(mha, causal=causal)
    off.need_weights = False
    r = examine(off, strict=True)
    assert not_passed(r) == {}, r.table()
    assert "return zeros (under no_grad: NaN)" in r["fully_masked_rows"].detail  # the inference fast path


def test_nanogpt_attention_and_lm():
    torch.manual_seed(0)
    r = examine(CausalSelfAttention(32, 4), strict=True)
    assert not_passed(r) == {} and r.info["description"]["causal_from"].startswith("causal (found")
    r = examine(GPT(64, 64, 2, 4, 32), strict=True)
    assert not_passed(r) == {}, r.table()
    assert r["kv_cache"].verdict.startswith("n/a: no KV cache (forward takes none of start_pos")


@pytest.fixture(scope="module")
def hf():
    pytest.importorskip("transformers")
    from attention_doctor.hf import build
    return build


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_transformers_models(hf, model_type, impl):
    r = examine(hf(model_type, impl), strict=True)
    want = {}
    if model_type == "gpt2":   # absolute positions counted from the padding (transformers #21080)
        want["padding"] = "warn"
    if impl == "eager":        # q k^T in float16 before the scale: inf at large q.k
        want["low_precision"] = "fail"
    assert not_passed(r) == want, r.table() + "\n" + r.details()
    assert r.exit_code == (1 if impl == "eager" else 0)
    if impl == "eager":   # named, and sized against the textbook order (scale first, float32 softmax)
        assert r["low_precision"].cause == "qk_before_scale", r["low_precision"].detail
        assert "finite up to scores" in r["low_precision"].detail and "textbook reference" in r["low_precision"].detail
    assert r.info["implementation"] == impl and r.header().endswith(f"(attention: {impl}; calls seen: 2 {impl if impl == 'sdpa' else 'softmax'})")
    assert r["path_agreement"].verdict == "pass"   # eager and sdpa, each against the reference
    assert r.info["qk_sites"] == 2


def test_hf_builder_makes_encoder_style_lms_decoders():
    """hf:bert is BertLMHeadModel as a decoder (is_decoder=True, as transformers asks): built as an
    encoder it reads the future (future_leak failed), the builder's fault, not BERT's. The config
    alone is checked: importing BERT's modeling code costs seconds."""
    pytest.importorskip("transformers")
    from attention_doctor.hf import small_config
    assert small_config("bert").is_decoder
    assert not small_config("bert", is_decoder=False).is_decoder
