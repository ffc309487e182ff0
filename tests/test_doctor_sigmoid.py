"""Sigmoid attention on a small module of the pattern (x-transformers' attn_sigmoid, Ramapuram et al.
2024): weights sigmoid(q k^T scale + mask), each key's on its own, then @ v. The probe reads them as a
call (the checks that need the weights look: they were inconclusive, no softmax seen), and a sigmoid
of the scores that does not go @ v (CoPE's position gates, into a cumsum) is no call."""
import torch
import torch.nn as nn

from attention_doctor import Adapter, examine
from attention_doctor.probes import Probe
from attention_doctor.result import FAIL, PASS

V, D, H = 32, 32, 2


class SigmoidAttention(nn.Module):
    """causal=False: the future keys left unmasked (a leak); gates=True: a softmax attention whose
    scores' sigmoid only makes position gates (CoPE's pattern), summed into the scores."""
    def __init__(self, causal=True, gates=False):
        super().__init__()
        self.causal, self.gates, self.qkv = causal, gates, nn.Linear(D, 3 * D)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, H, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        s = (q @ k.transpose(-2, -1)) * (D // H) ** -0.5
        if self.causal:
            s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -torch.finfo(s.dtype).max)
        if self.gates:
            s = s + s.sigmoid().flip(-1).cumsum(-1).flip(-1) * 0.1
            w = s.softmax(-1)
        else:
            w = s.sigmoid()
        return (w @ v).transpose(1, 2).reshape(B, T, D)


class SigmoidLM(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.emb, self.head = nn.Embedding(V, D), nn.Linear(D, V)
        self.attn = nn.ModuleList(SigmoidAttention(**kw) for _ in range(2))

    def forward(self, ids):
        x = self.emb(ids)
        for a in self.attn:
            x = x + a(x)
        return self.head(x)


class Plain(Adapter):
    kind, causal = "lm", True

    def __init__(self, lm):
        super().__init__(lm, "sigmoid")
        self.vocab_size = V

    def forward(self, x, mask=None, positions=None):
        return self.module(x)


def _calls(lm):
    torch.manual_seed(0)
    with Probe() as p:
        lm.eval()(torch.randint(0, V, (2, 8)))
    return p.calls


def test_sigmoid_weights_at_v_are_a_call_and_a_sigmoid_gate_is_not():
    calls = _calls(SigmoidLM())
    assert len(calls) == 2 and all(c.sigmoid and c.complete for c in calls), calls
    ref = calls[0].reference(torch.float64)
    assert float((ref - calls[0].out.double()).abs().max()) <= 1e-5
    gated = _calls(SigmoidLM(gates=True))
    assert len(gated) == 2 and not any(c.sigmoid for c in gated), gated   # the softmax calls only


def test_checks_that_need_the_weights_look_at_sigmoid_attention():
    torch.manual_seed(0)
    r = examine(Plain(SigmoidLM().eval()), checks=["eval_dropout", "self_visibility", "amplified_logits", "score_scale"])
    for name in ("self_visibility", "amplified_logits", "score_scale"):
        assert r[name].outcome is PASS, r[name]
    assert r["amplified_logits"].measurements["row_sum_error"] is None   # no row of sigmoid weights sums to one
    torch.manual_seed(0)
    row = examine(Plain(SigmoidLM(causal=False).eval()), checks=["eval_dropout", "amplified_logits"])["amplified_logits"]
    assert row.outcome is FAIL and row.cause == "future_leak", row
