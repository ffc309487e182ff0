"""Attention ruled out at the dispatcher (attention_doctor/mixing.py): a forward that mixes tokens
without attention weights (a state-space recurrence) makes the score checks n/a, by measurement;
a softmax the probe cannot see (a TorchScript function out of its reach) or an op from outside
torch keeps them inconclusive, never n/a. A TorchScript function of the attention module's own
code runs as Python while the probe looks (probes.unscripted), so its softmax is seen."""
import types

import torch
import torch.nn as nn

from attention_doctor import examine
from attention_doctor.mixing import watched
from attention_doctor.result import INCONCLUSIVE, NA, PASS

SCORE_CHECKS = ("self_visibility", "amplified_logits", "score_scale")


class Recurrence(nn.Module):
    """A gated linear recurrence over the sequence (Mamba's shape without its selectivity):
    h_t = a * h_{t-1} + (1 - a) * B x_t, y_t = C h_t; exp in the decay, no weights over tokens."""
    def __init__(self, d):
        super().__init__()
        self.log_a, self.B, self.C = nn.Parameter(torch.zeros(d) - 1.0), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        a = torch.exp(-torch.exp(self.log_a))
        u, h, out = self.B(x), torch.zeros_like(x[:, 0]), []
        for t in range(x.shape[1]):
            h = a * h + (1 - a) * u[:, t]
            out.append(self.C(h))
        return torch.stack(out, 1)


@torch.jit.script
def scripted_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    T = s.shape[-1]
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


class ScriptedAttention(nn.Module):
    """Causal attention whose softmax runs inside a TorchScript function of its own module (GPT-BigCode's
    upcast softmax in transformers 4.x)."""
    def __init__(self, d):
        super().__init__()
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        return self.proj(scripted_attention(*self.qkv(x).chunk(3, -1)))


ELSEWHERE = types.SimpleNamespace(attention=scripted_attention)   # held by an object: no global of the module


class FarScriptedAttention(ScriptedAttention):
    """The same script reached through another object: no global to run as Python."""
    def forward(self, x):
        return self.proj(ELSEWHERE.attention(*self.qkv(x).chunk(3, -1)))


class LM(nn.Module):
    def __init__(self, mixer, vocab=32, d=16, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mix = nn.ModuleList(mixer(d) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.emb(ids)
        for m in self.mix:
            x = x + m(x)
        return self.head(self.norm(x))


def test_a_recurrence_has_no_attention_and_its_score_checks_are_na():
    torch.manual_seed(0)
    r = examine(LM(Recurrence))
    rows = {c.name: c for c in r.checks}
    for name in SCORE_CHECKS:
        assert rows[name].outcome is NA and rows[name].cause == "no_attention", r.table()
    lp = rows["low_precision"]   # the half-precision runs still ran and were judged; the parts on scores do not apply
    assert lp.outcome is PASS and set(lp.measurements["not_applicable"]) == {"amplified_scores", "error_ratio"}, r.table()
    assert rows["future_leak"].outcome is PASS   # the black-box checks judge it as any other target


def test_a_script_of_the_modules_own_code_is_seen_as_python():
    torch.manual_seed(0)
    r = examine(LM(ScriptedAttention))
    rows = {c.name: c for c in r.checks}
    assert rows["self_visibility"].outcome is PASS and r.info["attention_calls"], r.table()
    assert isinstance(scripted_attention, torch.jit.ScriptFunction)   # put back after each probe


def test_a_script_out_of_reach_is_attention_and_stays_inconclusive():
    torch.manual_seed(0)
    model = LM(FarScriptedAttention)
    ids = torch.randint(0, 32, (2, 13))
    m = watched(lambda: model(ids), 13)
    assert "13 x 13" in m.weights and not m.none   # its scores, inside the script
    r = examine(model)
    rows = {c.name: c for c in r.checks}
    assert all(rows[n].outcome is not NA for n in SCORE_CHECKS), r.table()
    assert rows["self_visibility"].outcome is INCONCLUSIVE and rows["self_visibility"].cause == "scores_unseen"


def test_weights_over_tokens_are_attention_normalised_or_not():
    """A hand-made softmax and sigmoid attention (weights that sum to anything) form a T x T
    matrix; a mixer that forms none, a linear attention that multiplies phi(K)^T V first among
    them, has no weights to examine."""
    q, k, v = torch.randn(2, 13, 8), torch.randn(2, 13, 8), torch.randn(2, 13, 8)
    s = q @ k.transpose(-2, -1) / 8 ** 0.5
    w = (s - s.amax(-1, keepdim=True)).exp()
    assert "13 x 13" in watched(lambda: (w / w.sum(-1, keepdim=True)) @ v, 13).weights
    assert "13 x 13" in watched(lambda: torch.sigmoid(q @ k.transpose(-2, -1)) @ v, 13).weights
    assert watched(lambda: q.relu() @ (k.relu().transpose(-2, -1) @ v), 13).none   # linear attention: (8 x 8) first
    assert watched(lambda: torch.cumsum(q, 1) * k, 13).none   # mixing without weights


def test_an_op_from_outside_torch_is_not_looked_into():
    lib = torch.library.Library("doctor_mixing_test", "DEF")
    lib.define("mix(Tensor x) -> Tensor")
    lib.impl("mix", lambda x: x.cumsum(1), "CompositeExplicitAutograd")
    x = torch.randn(2, 13, 8)
    m = watched(lambda: torch.ops.doctor_mixing_test.mix(x), 13)
    assert m.opaque == "doctor_mixing_test::mix" and not m.none
