"""long_positions through a start_pos cache (Meta's convention) on learned absolute positions: the new
tokens' scores among themselves move with the start by design (an embedding per position), as they do
without a cache, where the doctor reads the outputs at +16 and finds them absolute. Through the cache
it reads the scores at +16 the same way: healthy passes, and rotary phases that lose precision at
+4096 (scores that agree at +16) still fail."""
import torch
import torch.nn as nn

from attention_doctor import examine

V, C, H, D, MAX = 64, 32, 2, 16, 4200


class StartPos(nn.Module):
    """One causal attention layer with a cache kept inside, written at start_pos (slots never written:
    zeros). `positions`: "learned" (an embedding per position added to the tokens') or "rope_coarse"
    (rotary phases from positions rounded to a multiple of 64 past 256: a precision loss far out)."""

    def __init__(self, positions="learned"):
        super().__init__()
        self.positions = positions
        self.emb, self.wpe = nn.Embedding(V, C), nn.Embedding(MAX, C)
        self.qkv, self.out, self.head = nn.Linear(C, 3 * H * D), nn.Linear(H * D, C), nn.Linear(C, V)
        self.register_buffer("k_cache", torch.zeros(0), persistent=False)
        self.register_buffer("v_cache", torch.zeros(0), persistent=False)

    def rotate(self, t, pos):
        p = torch.where(pos > 256, torch.round(pos / 64) * 64, pos).to(t.dtype)[:, None]
        ang = p * 10000 ** (-torch.arange(0, D, 2, dtype=t.dtype) / D)
        cos, sin = ang.cos(), ang.sin()
        a, b = t[..., : D // 2], t[..., D // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)

    def forward(self, tokens, start_pos=0):
        B, T = tokens.shape
        pos = torch.arange(start_pos, start_pos + T)
        x = self.emb(tokens) + (self.wpe(pos) if self.positions == "learned" else 0)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        if self.positions != "learned":
            q, k = self.rotate(q, pos.double()), self.rotate(k, pos.double())
        if start_pos == 0 or self.k_cache.shape[:1] != (B,):
            self.k_cache = torch.zeros(B, H, MAX, D, dtype=k.dtype)
            self.v_cache = torch.zeros(B, H, MAX, D, dtype=v.dtype)
        self.k_cache = self.k_cache.to(k.dtype)
        self.v_cache = self.v_cache.to(v.dtype)
        self.k_cache[:, :, start_pos:start_pos + T] = k.detach()
        self.v_cache[:, :, start_pos:start_pos + T] = v.detach()
        keys, values = self.k_cache[:, :, :start_pos + T], self.v_cache[:, :, :start_pos + T]
        s = q @ keys.transpose(-2, -1) / D ** 0.5
        hidden = torch.ones(T, start_pos + T, dtype=torch.bool).triu(start_pos + 1)
        w = torch.softmax(s.masked_fill(hidden, float("-inf")), -1)
        y = (w @ values).transpose(1, 2).reshape(B, T, H * D)
        return self.head(x + self.out(y))


def test_learned_positions_through_a_start_pos_cache_are_read_as_absolute():
    torch.manual_seed(0)
    r = examine(StartPos("learned"), checks=["long_positions"])
    row = r["long_positions"]
    assert row.measurements.get("through_cache"), r.details()
    assert not row.failed and row.measurements["absolute_positions"], r.details()
    assert row.measurements["shift_16"] > 0.05


def test_a_phase_lost_far_out_through_a_start_pos_cache_still_fails():
    torch.manual_seed(0)
    r = examine(StartPos("rope_coarse"), checks=["long_positions"])
    row = r["long_positions"]
    assert row.failed and row.cause == "shift_moves_outputs", r.details()
    assert not row.measurements["absolute_positions"]
