"""Scores that are a sum of products, on a small module of XLNet's pattern: q, k, v and position keys
made by einsums with Parameters (no projection module), time-major; the scores a content term q k^T
plus a position term shifted into place, times the scale after; the weights @ v an einsum whose output
puts the query axis first. And Mega's order: q times the scale before q k^T, a position bias added.
The probe reads the content product as the call's q k^T and its permuted weights @ v; the checks that
need q and k look (they were inconclusive: no q k^T feeds the softmax alone)."""
import pytest
import torch
import torch.nn as nn

from attention_doctor import Adapter, examine
from attention_doctor.probes import Probe
from attention_doctor.result import FAIL, INCONCLUSIVE, PASS

V, H, N, DH = 32, 32, 2, 16


class RelativeLM(nn.Module):
    """scale: the factor after the sum (XLNet: 1/sqrt(d_head)); before=True: the query times
    1/sqrt(d_head) as its last op before the products, none after (Mega's order)."""
    def __init__(self, scale=DH ** -0.5, before=False, layers=2):
        super().__init__()
        self.scale, self.before = scale, before
        self.emb, self.pos, self.head = nn.Embedding(V, H), nn.Embedding(64, H), nn.Linear(H, V)
        p = lambda *s: nn.Parameter(torch.randn(*s) * 0.2)   # noqa: E731
        self.w = nn.ParameterList(p(H, N, DH) for _ in range(5 * layers))       # q, k, v, r, o per layer
        self.bias = nn.ParameterList(p(N, DH) for _ in range(2 * layers))       # r_w, r_r per layer
        self.layers = layers

    @staticmethod
    def _shift(x, klen):
        b, n, i, j = x.shape   # XLNet's rel_shift_bnij: row i's relative positions moved into place
        x = x.reshape(b, n, j, i)[:, :, 1:, :].reshape(b, n, i, j - 1)
        return torch.index_select(x, 3, torch.arange(klen))

    def forward(self, ids):
        T = ids.shape[1]
        h = self.emb(ids).transpose(0, 1)                                            # (i, b, H)
        r = self.pos(torch.arange(2 * T - 1, -1, -1).clamp(max=63))[:, None]          # relative positions
        hidden = torch.ones(T, T).triu(1)                                             # 1 where masked
        for layer in range(self.layers):
            wq, wk, wv, wr, wo = self.w[5 * layer:5 * layer + 5]
            r_w, r_r = self.bias[2 * layer:2 * layer + 2]
            q, k, v = (torch.einsum("ibh,hnd->ibnd", h, w) for w in (wq, wk, wv))
            kr = torch.einsum("ibh,hnd->ibnd", r, wr)
            f = DH ** -0.5 if self.before else 1.0   # Mega's order: the query's last op is the scale
            ac = torch.einsum("ibnd,jbnd->bnij", (q + r_w) * f, k)
            bd = self._shift(torch.einsum("ibnd,jbnd->bnij", (q + r_r) * f, kr), T)
            s = (ac + bd) * (1.0 if self.before else self.scale) - 1e30 * hidden
            prob = nn.functional.softmax(s, dim=3)
            out = torch.einsum("bnij,jbnd->ibnd", prob, v)
            h = h + torch.einsum("ibnd,hnd->ibh", out, wo)
        return self.head(h.transpose(0, 1))


class Plain(Adapter):
    kind, causal = "lm", True

    def __init__(self, lm):
        super().__init__(lm, "relative")
        self.vocab_size = V

    def forward(self, x, mask=None, positions=None):
        return self.module(x)


def _examine(lm, checks):
    torch.manual_seed(0)
    return examine(Plain(lm.eval()), checks=["eval_dropout", *checks])


def test_the_probe_reads_the_content_product_and_the_permuted_weights_at_v():
    torch.manual_seed(0)
    lm = RelativeLM(layers=1).eval()
    ids = torch.randint(0, V, (2, 12))
    with Probe() as p:
        lm(ids)
    (c,) = p.calls
    assert c.extra.get("summed") and c.q.shape == c.k.shape == (2, N, 12, DH), c
    assert c.complete and c.out.shape == (2, N, 12, DH)
    ref = c.reference(torch.float64)
    assert float((ref - c.out.double()).abs().max()) <= 1e-5 * float(c.out.abs().max())


def test_checks_that_need_q_and_k_look_at_a_sum_of_scores():
    r = _examine(RelativeLM(), ["amplified_logits", "low_precision", "score_scale"])
    for name in ("amplified_logits", "low_precision", "score_scale"):
        assert r[name].outcome is not INCONCLUSIVE, r[name]
    assert r["amplified_logits"].outcome is PASS, r["amplified_logits"]
    assert r["score_scale"].outcome is PASS and "as the attention calls get them" in r["score_scale"].detail


@pytest.mark.parametrize("lm, outcome", [(RelativeLM(scale=1.0), FAIL), (RelativeLM(before=True), PASS)],
                         ids=["no_scale", "scaled_before"])
def test_score_scale_inside_the_calls_reads_a_scale_before_or_after_the_product(lm, outcome):
    row = _examine(lm, ["score_scale"])["score_scale"]
    assert row.outcome is outcome, row
    if outcome is FAIL:
        assert row.cause == "too_large" and row.measured > 2, row   # ~ sqrt(16) without the scale
