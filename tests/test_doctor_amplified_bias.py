"""low_precision's top stress level is aimed at scores of ~3e4 even where the amplifier landed lower
in its band (a bias beside q . k, ALiBi's, keeps the first try short): at ~1.6e4 an unscaled q k^T of
d = 16 stays under float16's 65504, and q k^T formed before the scale passed. Beside ALiBi and a
sink logit, the scale after the product fails qk_before_scale; the scale on q first passes. Beside
sigmoid weights and an additive finfo.min mask the outputs stay finite (a +inf product plus finfo.min
is +inf: a masked key weighted 1), and their values show it."""
import math

import torch
import torch.nn as nn

from attention_doctor import examine

V, C, H, D = 64, 32, 2, 16
SLOPE = 0.2   # ALiBi slopes 0.2, 0.1: the bias about the size of q . k at init, so the first try lands at ~1.2e4


class AlibiSinks(nn.Module):
    """Causal attention with ALiBi (slopes SLOPE x (1, 1/2)) and one sink logit per head joining each row;
    `scale_after`: q k^T formed first, then scaled."""

    def __init__(self, scale_after):
        super().__init__()
        self.scale_after = scale_after
        self.emb, self.qkv, self.out, self.head = (nn.Embedding(V, C), nn.Linear(C, 3 * H * D), nn.Linear(H * D, C),
                                                   nn.Linear(C, V))
        self.sinks = nn.Parameter(torch.zeros(H))

    def forward(self, ids):
        x = self.emb(ids)
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        scale = 1 / math.sqrt(D)
        s = (q @ k.transpose(-2, -1)) * scale if self.scale_after else (q * scale) @ k.transpose(-2, -1)
        i = torch.arange(T, device=ids.device)
        s = s - SLOPE * torch.tensor([1.0, 0.5], device=ids.device, dtype=s.dtype)[:, None, None] * (i[:, None] - i[None, :]).abs()
        s = s.masked_fill(i[None, :] > i[:, None], torch.finfo(s.dtype).min)
        sink = self.sinks.view(1, H, 1, 1).expand(B, H, T, 1).to(s.dtype)
        w = torch.softmax(torch.cat([s, sink], -1), -1)[..., :T]
        y = (w @ v).transpose(1, 2).reshape(B, T, H * D)
        return self.head(x + self.out(y))


def test_qk_before_the_scale_beside_a_bias_fails_low_precision():
    torch.manual_seed(0)
    row = examine(AlibiSinks(scale_after=True), checks=["low_precision"])["low_precision"]
    assert row.failed and row.cause == "qk_before_scale", row.detail
    torch.manual_seed(0)
    healthy = examine(AlibiSinks(scale_after=False), checks=["low_precision"])["low_precision"]
    assert not healthy.failed, healthy.detail


class SigmoidAdditive(nn.Module):
    """Causal sigmoid attention (sigmoid(s - log 16)) with an additive 0 / finfo.min mask; `scale_after`:
    q k^T formed first, then scaled."""

    def __init__(self, scale_after):
        super().__init__()
        self.scale_after = scale_after
        self.emb, self.qkv, self.out, self.head = (nn.Embedding(V, C), nn.Linear(C, 3 * H * D), nn.Linear(H * D, C),
                                                   nn.Linear(C, V))

    def forward(self, ids):
        x = self.emb(ids)
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        scale = 1 / math.sqrt(D)
        s = (q @ k.transpose(-2, -1)) * scale if self.scale_after else (q * scale) @ k.transpose(-2, -1)
        i = torch.arange(T, device=ids.device)
        mask = torch.zeros(T, T, dtype=s.dtype, device=ids.device).masked_fill(i[None, :] > i[:, None],
                                                                               torch.finfo(s.dtype).min)
        w = torch.sigmoid(s + mask - math.log(16))
        y = (w @ v).transpose(1, 2).reshape(B, T, H * D)
        return self.head(x + self.out(y))


def test_qk_before_the_scale_hidden_by_sigmoid_weights_fails_on_the_outputs_values():
    torch.manual_seed(0)
    row = examine(SigmoidAdditive(scale_after=True), checks=["low_precision"])["low_precision"]
    assert row.failed and row.cause == "qk_before_scale", row.detail
    assert row.measurements["nonfinite_runs"] == []   # every output finite: the values are the witness
    seen = row.measurements["hidden_overflow"]
    assert {(h["dtype"], h["mode"]) for h in seen} == {("float16", "weights"), ("float16", "autocast")}
    assert all(h["error"] > 2 * h["textbook_error"] and h["error"] > 0.1 for h in seen), seen
    torch.manual_seed(0)
    healthy = examine(SigmoidAdditive(scale_after=False), checks=["low_precision"])["low_precision"]
    assert healthy.outcome.value == "pass" and healthy.measurements["hidden_overflow"] == [], healthy.detail
