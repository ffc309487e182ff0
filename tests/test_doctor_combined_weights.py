"""Weights formed as a combination of softmax maps (differential attention: A1 - lambda A2, rows that
sum to 1 - lambda and go negative by design) are held to what they are: each softmax's own rows sum
to one, but the product's output is no mix of the values, so no hull is held to it; a map left
without its causal mask still fails."""
import torch
import torch.nn as nn

from attention_doctor import examine

V, C, H, D = 64, 32, 2, 16


class Differential(nn.Module):
    """Differential attention (Ye et al. 2024) written by hand: two softmax maps over two q k^T,
    subtracted with lambda = 0.8, then @ v. `second_masked=False`: the second map sees the future."""

    def __init__(self, second_masked=True, own_dropped=False):
        super().__init__()
        self.second_masked, self.own_dropped = second_masked, own_dropped
        self.emb, self.qk, self.v = nn.Embedding(V, C), nn.Linear(C, 4 * H * D), nn.Linear(C, H * D)
        self.out, self.head = nn.Linear(H * D, C), nn.Linear(C, V)

    def forward(self, ids):
        x = self.emb(ids)
        B, T, _ = x.shape
        q1, k1, q2, k2 = (t.view(B, T, H, D).transpose(1, 2) for t in self.qk(x).chunk(4, -1))
        v = self.v(x).view(B, T, H, D).transpose(1, 2)
        hidden = torch.ones(T, T, dtype=torch.bool).triu(1)
        a1 = torch.softmax((q1 @ k1.transpose(-2, -1) / D ** 0.5).masked_fill(hidden, float("-inf")), -1)
        s2 = q2 @ k2.transpose(-2, -1) / D ** 0.5
        a2 = torch.softmax(s2.masked_fill(hidden, float("-inf")) if self.second_masked else s2, -1)
        w = a1 - 0.8 * a2
        if self.own_dropped:   # each query's own key zeroed after the softmax (the first keeps it: no empty row)
            w = w * ~torch.eye(T, dtype=torch.bool).index_fill(0, torch.tensor([0]), False)
        y = (w @ v).transpose(1, 2).reshape(B, T, H * D)
        return self.head(x + self.out(y))


def test_differential_attention_is_held_to_what_it_is():
    torch.manual_seed(0)
    r = examine(Differential(), checks=["eval_dropout", "future_leak", "self_visibility", "amplified_logits"])
    assert not r.failed, r.table() + "\n" + r.details()
    assert r["amplified_logits"].measurements["row_sum_error"] < 1e-6   # each map's rows still sum to one
    leaky = examine(Differential(second_masked=False), checks=["eval_dropout", "future_leak", "amplified_logits"])
    assert leaky["future_leak"].failed and leaky["future_leak"].cause == "outputs_move", leaky.details()


def test_an_own_key_zeroed_in_the_weights_that_mix_the_values_is_seen():
    # the softmax maps keep the diagonal; the weights the product takes drop it
    torch.manual_seed(0)
    r = examine(Differential(own_dropped=True), checks=["eval_dropout", "self_visibility"])
    assert r["self_visibility"].failed and r["self_visibility"].cause == "own_key_masked", r.details()


class Hard(nn.Module):
    """Hard attention written by hand: each row's argmax as a one-hot (straight through the softmax's
    gradient) is what mixes the values. Its zeros move with the tokens: a choice of key, not a mask."""

    def __init__(self):
        super().__init__()
        self.emb, self.qkv = nn.Embedding(V, C), nn.Linear(C, 3 * H * D)
        self.out, self.head = nn.Linear(H * D, C), nn.Linear(C, V)

    def forward(self, ids):
        x = self.emb(ids)
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        hidden = torch.ones(T, T, dtype=torch.bool).triu(1)
        soft = torch.softmax((q @ k.transpose(-2, -1) / D ** 0.5).masked_fill(hidden, float("-inf")), -1)
        hard = nn.functional.one_hot(soft.argmax(-1), T).to(soft.dtype)
        y = ((hard - soft.detach() + soft) @ v).transpose(1, 2).reshape(B, T, H * D)
        return self.head(x + self.out(y))


def test_hard_attention_choosing_another_key_is_no_own_key_masked():
    # x-transformers' attn_hard failed own_key_masked once the one-hot was read as a mask
    torch.manual_seed(0)
    r = examine(Hard(), checks=["eval_dropout", "self_visibility"])
    assert not r["self_visibility"].failed, r.details()


def _cleaned_row_attention(q, k, v, keep, clean_future=False):
    """A mask with a fully masked row (query 0 sees nothing: its softmax is NaN), cleaned after the
    softmax by masked_fill(~keep, 0) (CpmAnt's); `clean_future`: the cleaning zeroes a visible key too."""
    s = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(~keep, float("-inf"))
    w = torch.softmax(s, -1)
    drop = ~keep
    if clean_future:
        drop = drop | torch.eye(keep.shape[-1], dtype=torch.bool)
    return w.masked_fill(drop, 0.0) @ v


def test_weights_cleaned_of_a_masked_rows_nan_after_the_softmax_are_still_the_calls_own():
    """Only the softmax's zero or non-finite entries set to 0: the product still mixes this call's values
    (v and out read, the call recomputable); a visible key zeroed too is other weights (combined)."""
    from attention_doctor.probes import Probe
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, 6, D) for _ in range(3))
    keep = torch.ones(6, 6, dtype=torch.bool).tril()
    keep[0] = False   # a row with no visible key
    for clean_future, own in ((False, True), (True, False)):
        with Probe() as p:
            _cleaned_row_attention(q, k, v, keep, clean_future)
        (c,) = p.calls
        assert (c.complete and c.v is not None and c.out is not None) == own, (clean_future, c.extra.keys())
        assert c.extra.get("combined_weights", False) != own
