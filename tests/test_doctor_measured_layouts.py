"""Score layouts read by measurement: attention whose scores come out as (B, T_q, H, T_k) (an einsum
'bshd,bthd->bsht', DeepSeek-V2-style latent attention written by hand) is read with its query axis
where a change of the last token shows it, never assumed to be (B, H, T_q, T_k): healthy passes
self_visibility, a diagonal masked off is still caught."""
import torch
import torch.nn as nn

from attention_doctor import examine

V, C, H, D = 64, 32, 4, 8


class QueriesBeforeHeads(nn.Module):
    """Causal attention with scores (B, T_q, H, T_k) and a softmax over the last axis; `absorbed`:
    the scores a sum of two einsums (a content part and a rope part, MLA's absorbed path);
    `diagonal`: the causal mask's offset (1 healthy, 0 each query's own key masked)."""

    def __init__(self, absorbed=False, diagonal=1):
        super().__init__()
        self.absorbed, self.diagonal = absorbed, diagonal
        self.emb, self.q, self.k, self.v = nn.Embedding(V, C), nn.Linear(C, H * D), nn.Linear(C, H * D), nn.Linear(C, H * D)
        self.qr, self.kr = nn.Linear(C, H * D), nn.Linear(C, D)
        self.out, self.head = nn.Linear(H * D, C), nn.Linear(C, V)

    def forward(self, ids):
        x = self.emb(ids)
        B, T, _ = x.shape
        q, k, v = (f(x).view(B, T, H, D) for f in (self.q, self.k, self.v))
        q = q / D ** 0.5   # scaled first: q k^T stays in float16's range
        s = torch.einsum("bshd,bthd->bsht", q, k)
        if self.absorbed:
            s = s + torch.einsum("bshd,btd->bsht", self.qr(x).view(B, T, H, D) / D ** 0.5, self.kr(x))
        hidden = torch.ones(T, T, dtype=torch.bool).triu(self.diagonal)   # (T_q, T_k)
        s = s.masked_fill(hidden[None, :, None, :], float("-inf"))
        w = torch.softmax(s, dim=-1)
        y = torch.einsum("bsht,bthd->bshd", w, v).reshape(B, T, H * D)
        return self.head(x + self.out(y))


def test_queries_before_heads_are_read_as_queries():
    for absorbed in (False, True):
        torch.manual_seed(0)
        r = examine(QueriesBeforeHeads(absorbed))
        assert not r.failed, r.table() + "\n" + r.details()
        assert r.info["attention_calls"] == {"softmax": 1}
        assert r["self_visibility"].outcome.value == "pass", r.details()
        bug = examine(QueriesBeforeHeads(absorbed, diagonal=0), checks=["eval_dropout", "self_visibility"])
        assert bug["self_visibility"].failed, bug.details()


class HeadsAsLong(nn.Module):
    """Causal attention with scores (B, T_q, H, T_k) and as many heads as tokens (H = T = 16): the
    heads' axis could be read as the queries. `diagonal` as QueriesBeforeHeads' (2: each query sees
    the next key, so a later layer's scores move with the last token at every query)."""

    def __init__(self, diagonal=1, heads=16, d=4):
        super().__init__()
        self.diagonal, self.h, self.d = diagonal, heads, d
        self.qkv, self.out = nn.Linear(C, 3 * heads * d), nn.Linear(heads * d, C)

    def forward(self, x):
        B, T, _ = x.shape
        hidden = torch.ones(T, T, dtype=torch.bool).triu(self.diagonal)
        hidden[0, 0] = False   # the first query keeps a key to see (no row of NaN)
        q, k, v = (t.view(B, T, self.h, self.d) for t in self.qkv(x).chunk(3, -1))
        s = torch.einsum("bshd,bthd->bsht", q / self.d ** 0.5, k).masked_fill(hidden[None, :, None, :], float("-inf"))
        return self.out(torch.einsum("bsht,bthd->bshd", torch.softmax(s, -1), v).reshape(B, T, -1))


class TwoLayers(nn.Module):
    def __init__(self, diagonal=1):
        super().__init__()
        self.emb, self.head = nn.Embedding(V, C), nn.Linear(C, V)
        self.layers = nn.ModuleList(HeadsAsLong(diagonal) for _ in range(2))

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


def test_a_layout_that_cannot_be_measured_is_not_read():
    checks = ["eval_dropout", "future_leak", "self_visibility"]
    torch.manual_seed(0)
    r = examine(TwoLayers(), checks=checks, strict=True)
    assert not r.failed and r["self_visibility"].outcome.value == "pass", r.details()   # measured in both layers
    torch.manual_seed(0)
    off = examine(TwoLayers(diagonal=0), checks=checks, strict=True)["self_visibility"]
    assert off.failed and off.cause == "own_key_masked", off.detail
    torch.manual_seed(0)
    r = examine(TwoLayers(diagonal=2), checks=checks, strict=True)
    assert r["future_leak"].failed   # the outputs show the leak
    row = r["self_visibility"]   # the second layer's queries could be its heads: not read as either
    assert row.outcome == "inconclusive" and "could not be measured" in row.reason, row.reason
