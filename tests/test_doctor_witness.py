"""No fail without a witness: a fail read inside the forward (a mask, weights, row sums, a hull)
stands where what the outputs do agrees; where they contradict it the check is inconclusive
(readings_disagree), naming both. Weights with a sink that absorbs mass by design (a logit of
its own per head in the softmax's denominator) are held to what they are: rows at most one, a
hull with the sink's zero value."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_doctor import examine

V, C, H, D = 64, 32, 2, 16
CHECKS = ["eval_dropout", "future_leak", "self_visibility", "amplified_logits"]


class SinkLM(nn.Module):
    """Attention sinks. style "cat": gpt-oss's learned logits concatenated to the scores, the column
    dropped after the softmax; "denominator": the same by hand, exp(s - m) / (exp(sink - m) + sum
    exp(s - m)). bug "no_mask": no causal mask; "numerator_mask": the mask applied to the
    numerator only, the masked keys' exps left in the denominator (weight lost per query, not a
    sink); "sum_normalize": s / sum(s)."""

    def __init__(self, style="denominator", bug=""):
        super().__init__()
        self.style, self.bug = style, bug
        self.emb, self.qkv = nn.Embedding(V, C), nn.Linear(C, 3 * H * D)
        self.sinks = nn.Parameter(torch.randn(H))
        self.out, self.head = nn.Linear(H * D, C), nn.Linear(C, V)

    def forward(self, ids):
        x = self.emb(ids)
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        s = q @ k.transpose(-2, -1) / D ** 0.5
        hidden = torch.ones(T, T, dtype=torch.bool).triu(1)
        sink = self.sinks.view(1, H, 1, 1).expand(B, H, T, 1)
        masked = s if self.bug == "no_mask" else s.masked_fill(hidden, float("-inf"))
        if self.style == "cat":
            w = torch.softmax(torch.cat([masked, sink], -1), -1)[..., :-1]
        else:
            m = torch.maximum(masked.amax(-1, keepdim=True), sink)
            e = torch.exp(masked - m)
            lost = torch.exp(s - m).masked_fill(~hidden, 0).sum(-1, keepdim=True) if self.bug == "numerator_mask" else 0
            w = e / (torch.exp(sink - m) + e.sum(-1, keepdim=True) + lost)
        if self.bug == "sum_normalize":
            w = s.masked_fill(hidden, 0) / s.masked_fill(hidden, 0).sum(-1, keepdim=True)
        y = (w @ v).transpose(1, 2).reshape(B, T, H * D)
        return self.head(x + self.out(y))


def _run(model, checks=CHECKS):
    torch.manual_seed(0)
    return examine(model, checks=checks, strict=True)


def test_sinks_are_held_to_what_they_are():
    for style in ("cat", "denominator"):
        torch.manual_seed(0)
        r = _run(SinkLM(style))
        assert not r.failed and r["amplified_logits"].outcome == "pass", r.details()
    torch.manual_seed(0)
    r = _run(SinkLM("denominator"))
    assert "sink" in r["amplified_logits"].detail   # the rows below one are said to be a sink's


def test_bugs_beside_a_sink_still_fail():
    want = {"no_mask": ("future_leak", "outputs_move"), "numerator_mask": ("amplified_logits", "row_sum"),
            "sum_normalize": ("amplified_logits", "outside_hull")}
    for bug, (check, cause) in want.items():
        torch.manual_seed(0)
        r = _run(SinkLM("denominator", bug))
        assert r[check].failed and r[check].cause == cause, (bug, r.details())


class BiasedSDPA(nn.Module):
    """SDPA with a float mask. diagonal: the bias on each query's own key (the others' -999, the
    future -inf). -inf: a token cannot see itself (masked); -1005: below the doctor's masked
    threshold (-1e3) but 6 logits from the others, so it keeps weight: a bias, not a mask."""

    def __init__(self, diagonal=0.0):
        super().__init__()
        self.diagonal = diagonal
        self.emb, self.qkv = nn.Embedding(V, C), nn.Linear(C, 3 * H * D)
        self.out, self.head = nn.Linear(H * D, C), nn.Linear(C, V)

    def forward(self, ids):
        x = self.emb(ids)
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        bias = torch.full((T, T), -999.0).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        bias = bias.masked_fill(torch.eye(T, dtype=torch.bool), self.diagonal)
        bias[0, 0] = -999.0   # the first query keeps a key to see
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.head(x + self.out(y.transpose(1, 2).reshape(B, T, H * D)))


def test_self_visibility_needs_the_weights_and_the_output_to_agree_with_the_mask():
    checks = ["eval_dropout", "self_visibility"]
    assert _run(BiasedSDPA(-999.0), checks)["self_visibility"].outcome == "pass"
    masked = _run(BiasedSDPA(float("-inf")), checks)["self_visibility"]
    assert masked.failed and masked.cause == "own_key_masked", masked.detail
    biased = _run(BiasedSDPA(-1005.0), checks)["self_visibility"]
    assert biased.outcome == "inconclusive" and biased.cause == "readings_disagree", biased.detail
    assert "mask read hides" in biased.reason and "weight on their own key" in biased.reason
