"""Outputs that cannot move (an output projection zero at init, nanochat's and ReZero's manner) are
made able to show the attention in the doctor's copy (sensitivity.py): a mask that lets each query
see the next key fails future_leak instead of passing unseen; healthy passes; where no later output
moves and nothing is zero to fill, future_leak is inconclusive, never a pass."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_doctor import examine

V, C, H = 64, 32, 4


class ZeroProjLM(nn.Module):
    """One attention layer whose output projection starts at zero; `diagonal` is the causal mask's
    offset (1: healthy, 2: each query sees the next key); `self_only`: each query sees itself alone."""

    def __init__(self, diagonal=1, self_only=False):
        super().__init__()
        self.diagonal, self.self_only = diagonal, self_only
        self.emb, self.qkv, self.proj, self.head = nn.Embedding(V, C), nn.Linear(C, 3 * C), nn.Linear(C, C), nn.Linear(C, V)
        if not self_only:
            nn.init.zeros_(self.proj.weight)

    def forward(self, ids):
        B, T = ids.shape
        x = self.emb(ids)
        q, k, v = (t.view(B, T, H, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        if self.self_only:
            hidden = ~torch.eye(T, dtype=torch.bool)
        else:
            hidden = torch.ones(T, T, dtype=torch.bool).triu(self.diagonal)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=~hidden)
        return self.head(x + self.proj(y.transpose(1, 2).reshape(B, T, C)))


def test_a_zero_output_projection_is_filled_in_the_copy_and_a_leak_is_seen():
    torch.manual_seed(0)
    leaky = ZeroProjLM(diagonal=2)
    r = examine(leaky, checks=["eval_dropout", "future_leak"])
    assert r["future_leak"].failed and r["future_leak"].cause == "outputs_move", r.details()
    assert r.info["filled_zero_weights"] == ["proj.weight"]
    assert not leaky.proj.weight.any()               # the caller's model keeps its zeros
    healthy = examine(ZeroProjLM(), checks=["eval_dropout", "future_leak"])
    assert healthy["future_leak"].outcome.value == "pass", healthy.details()


def test_outputs_that_move_with_nothing_are_inconclusive_not_a_pass():
    torch.manual_seed(0)
    r = examine(ZeroProjLM(self_only=True), checks=["eval_dropout", "future_leak"])
    assert r.info.get("insensitive_outputs") and "filled_zero_weights" not in r.info
    assert r["future_leak"].inconclusive and r["future_leak"].cause == "insensitive_outputs", r.details()
    assert r.exit_code == 3


class LayerScaleLM(ZeroProjLM):
    """The attention's output scaled by a per-channel gamma that starts at zero (LayerScale, as
    x-transformers' use_layerscale builds it): no matrix is zero, the outputs still cannot move."""

    def __init__(self, diagonal=1):
        super().__init__(diagonal, self_only=False)
        nn.init.normal_(self.proj.weight, std=0.1)
        self.gamma = nn.Parameter(torch.zeros(C))

    def forward(self, ids):
        B, T = ids.shape
        x = self.emb(ids)
        q, k, v = (t.view(B, T, H, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        hidden = torch.ones(T, T, dtype=torch.bool).triu(self.diagonal)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=~hidden)
        return self.head(x + self.gamma * self.proj(y.transpose(1, 2).reshape(B, T, C)))


def test_a_zero_gate_is_filled_where_the_matrices_leave_the_outputs_still():
    torch.manual_seed(0)
    leaky = LayerScaleLM(diagonal=2)
    r = examine(leaky, checks=["eval_dropout", "future_leak"])
    assert r["future_leak"].failed and r["future_leak"].cause == "outputs_move", r.details()
    assert r.info["filled_zero_weights"] == ["gamma"]
    assert not leaky.gamma.any()                      # the caller's model keeps its zeros
    healthy = examine(LayerScaleLM(), checks=["eval_dropout", "future_leak"])
    assert healthy["future_leak"].outcome.value == "pass", healthy.details()


def _zero_out(model):
    """The model with every attention's output projection zero (nanochat's init), in place."""
    for name, p in model.named_parameters():
        if name.endswith("attention.wo.weight"):
            nn.init.zeros_(p)
    return model


def test_conventions_are_found_on_outputs_that_can_move():
    # a cache kept inside and written at start_pos (Meta's manner) with zero output projections: found
    # on the copy's unfilled outputs, the cache read as absent (kv_cache n/a) and a top-left step mask shipped
    from doctor_lab.styles import llama
    torch.manual_seed(0)
    r = examine(_zero_out(llama.build("cache_top_left")), checks=["eval_dropout", "kv_cache"])
    assert r.info["filled_zero_weights"], r.info
    assert r["kv_cache"].failed, r.details()
    healthy = examine(_zero_out(llama.build()), checks=["eval_dropout", "kv_cache"])
    assert healthy["kv_cache"].outcome.value == "pass", healthy.details()
