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
