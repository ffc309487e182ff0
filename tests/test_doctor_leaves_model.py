"""examine() runs its checks on copies: the caller's model comes back bit for bit and mode for mode
as it was (train mode, float64, a complex RoPE buffer, a KV cache filled before the call), and the
caller's RNG streams are where they were."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_doctor import examine
from attention_doctor.dispatch import adapt

V, C, H, T_MAX = 64, 32, 4, 64


def rope_table(d, n):
    """torchtitan's manner: e^(i pos theta) as a complex64 buffer (n, d / 2)."""
    theta = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    return torch.polar(torch.ones(n, d // 2), torch.outer(torch.arange(n).float(), theta))


def rotate(x, fc):
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * fc[:, None, :]).flatten(-2).type_as(x)


class CachedRopeLM(nn.Module):
    """A one-layer causal LM with complex RoPE and a KV cache buffer its forward writes."""

    def __init__(self):
        super().__init__()
        self.emb, self.qkv, self.proj = nn.Embedding(V, C), nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.drop, self.head = nn.Dropout(0.1), nn.Linear(C, V)
        self.register_buffer("freqs_cis", rope_table(C // H, T_MAX))
        self.register_buffer("cache_k", torch.zeros(1, T_MAX, H, C // H))

    def forward(self, ids):
        B, T = ids.shape
        q, k, v = self.qkv(self.emb(ids)).view(B, T, 3, H, C // H).unbind(2)
        fc = self.freqs_cis[:T]
        q, k = rotate(q, fc), rotate(k, fc)
        self.cache_k[:, :T] = k[:1].detach().to(self.cache_k.dtype)
        y = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
        return self.head(self.drop(self.proj(y.transpose(1, 2).reshape(B, T, C))))


def state(m):
    return {"modes": [s.training for s in m.modules()],
            "tensors": {n: (t.dtype, t.device, t.detach().clone()) for n, t in
                        [*m.named_parameters(), *m.named_buffers()]},
            "ids": {n: id(t) for n, t in [*m.named_parameters(), *m.named_buffers()]}}


def test_examine_leaves_the_model_and_the_rng_as_found():
    torch.manual_seed(0)
    model = CachedRopeLM().double().train()
    assert model.freqs_cis.dtype == torch.complex64    # .double() keeps complex buffers complex
    model(torch.randint(0, V, (1, 8)))                  # the cache filled before the call
    before, rng = state(model), torch.get_rng_state()
    r = examine(model)
    after = state(model)
    assert after["modes"] == before["modes"] and all(after["modes"])
    assert after["ids"] == before["ids"]
    for n, (dt, dev, t) in before["tensors"].items():
        dt2, dev2, t2 = after["tensors"][n]
        assert (dt2, dev2) == (dt, dev), n
        assert torch.equal(t2, t), n                  # bit for bit, the cache included
    assert model.cache_k[:, :8].abs().sum() > 0 and model.cache_k[:, 8:].abs().sum() == 0
    assert torch.equal(torch.get_rng_state(), rng)
    assert r.info["dtype"] == "float32"                # the checks ran on a float32 copy


def test_a_dtype_copy_keeps_complex_rope_rotating():
    """The float32 copy the checks run on computes what the float64 model computes (nn.Module.to
    keeps a complex table's real part only: RoPE that scales instead of rotating)."""
    torch.manual_seed(0)
    model = CachedRopeLM().double().eval()
    ids = torch.randint(0, V, (2, 16))
    copy = adapt(model).converted(dtype=torch.float32).module
    assert copy.freqs_cis.dtype == torch.complex64 and copy.qkv.weight.dtype == torch.float32
    assert copy is not model and copy.freqs_cis.data_ptr() != model.freqs_cis.data_ptr()
    torch.testing.assert_close(copy(ids), model(ids).float(), atol=1e-4, rtol=1e-4)


class Reordered(nn.Module):
    """A layer whose eval output moves by a few ulps on several threads only (sums reordered across
    threads, as GPT-2's eager path beside other load) or, `dropout=True`, by dropout left on."""

    def __init__(self, dropout=False):
        super().__init__()
        self.dropout, self.lin, self.calls = dropout, nn.Linear(8, 8), 0

    def forward(self, x):
        y = self.lin(x)
        if self.dropout:
            return F.dropout(y, 0.1, training=True)
        self.calls += 1   # each call a few ulps off the last, on several threads only
        return y * (1 + torch.finfo(y.dtype).eps * self.calls * (torch.get_num_threads() > 1))


def test_reordering_across_threads_is_told_from_dropout_by_one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        r = examine(Reordered(), checks=["eval_dropout", "batch_independence"], causal=False, strict=True)
        assert r["eval_dropout"].outcome.value == "pass" and 0 < r["eval_dropout"].measured < 1e-5, r.details()
        assert "one thread" in r["eval_dropout"].detail
        assert r["batch_independence"].outcome.value == "pass", r.details()   # compared on one thread
        assert torch.get_num_threads() == 2                                    # the caller's count back
        d = examine(Reordered(dropout=True), checks=["eval_dropout"], causal=False)
        assert d["eval_dropout"].failed and d["eval_dropout"].cause == "random_in_eval"
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
