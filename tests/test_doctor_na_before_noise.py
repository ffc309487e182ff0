"""A check whose interface the target lacks says n/a even where the target's eval outputs are not
repeatable (dropout left on in eval): n/a is decided before repeatability is required, so
config_roundtrip (no save and load), padding (no mask), future_leak (bidirectional) are n/a, not
`inconclusive (not_repeatable)`, beside eval_dropout's fail."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_doctor import examine

C = 16
CHECKS = ["eval_dropout", "future_leak", "padding", "config_roundtrip"]


class Bidirectional(nn.Module):
    """One head over every position; `dropout` leaves dropout on the weights in eval."""

    def __init__(self, dropout=False):
        super().__init__()
        self.dropout, self.qkv, self.out = dropout, nn.Linear(C, 3 * C), nn.Linear(C, C)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        w = torch.softmax(q @ k.transpose(-2, -1) / C ** 0.5, -1)
        if self.dropout:
            w = F.dropout(w, 0.2, training=True)
        return self.out(w @ v)


def _rows(dropout):
    torch.manual_seed(0)
    r = examine(Bidirectional(dropout), causal=False, checks=CHECKS, strict=True)
    return r, {c: (r[c].outcome, r[c].cause) for c in CHECKS}


def test_healthy_repeatable_interfaces_absent_are_na():
    r, rows = _rows(False)
    assert rows["eval_dropout"][0] == "pass", r.details()
    assert rows["config_roundtrip"] == ("n/a", "no_save_load"), r.details()
    assert rows["padding"] == ("n/a", "no_padding_mask"), r.details()
    assert rows["future_leak"] == ("n/a", "not_causal"), r.details()


def test_dropout_in_eval_fails_and_absent_interfaces_stay_na():
    r, rows = _rows(True)
    assert rows["eval_dropout"] == ("fail", "random_in_eval"), r.details()
    assert rows["config_roundtrip"] == ("n/a", "no_save_load"), r.details()
    assert rows["padding"] == ("n/a", "no_padding_mask"), r.details()
    assert rows["future_leak"] == ("n/a", "not_causal"), r.details()


class TinyLM(nn.Module):
    """A causal LM without a cache; `dropout` leaves dropout on the weights in eval."""

    def __init__(self, dropout=False):
        super().__init__()
        self.dropout, self.emb, self.qkv, self.head = dropout, nn.Embedding(32, C), nn.Linear(C, 3 * C), nn.Linear(C, 32)

    def forward(self, ids):
        x = self.emb(ids)
        q, k, v = self.qkv(x).chunk(3, -1)
        T = ids.shape[1]
        s = (q @ k.transpose(-2, -1) / C ** 0.5).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        w = torch.softmax(s, -1)
        if self.dropout:
            w = F.dropout(w, 0.2, training=True)
        return self.head(x + w @ v)


def test_lm_without_cache_kv_cache_na_with_dropout_on_in_eval():
    for dropout in (False, True):
        torch.manual_seed(0)
        r = examine(TinyLM(dropout), checks=["eval_dropout", "kv_cache"], strict=True)
        assert r["eval_dropout"].outcome.value == ("fail" if dropout else "pass"), r.details()
        assert (r["kv_cache"].outcome.value, r["kv_cache"].cause) == ("n/a", "no_kv_cache"), r.details()
