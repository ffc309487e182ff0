"""issue 44 items 3 and 4: FlexAttention as a notation the doctor sees (its calls recorded with
their score_mod and BlockMask, the scores measured densely, forward-only), forward-only targets
(flex on CPU refuses autograd; a forward under torch.inference_mode), and a check that sets up a
KV cache leaving the next check the target as given."""
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.attention.flex_attention as fa_module
import torch.nn.functional as F
from torch.nn.attention.flex_attention import and_masks, create_block_mask, create_mask, flex_attention

from attention_doctor import examine
from attention_doctor.probes import Probe

C, HEADS = 16, 2


@pytest.fixture(autouse=True)
def eager_flex(monkeypatch):
    """flex_attention's eager kernel without its torch.compile wrapper (seconds, not minutes here);
    the call the doctor intercepts is the same public function."""
    monkeypatch.setattr(fa_module, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class FlexAttention(nn.Module):
    """One flex_attention call: a causal mask_mod (and a padding one over a captured keep tensor)
    through create_block_mask, or the same as a score_mod giving -inf; `shift` -1 hides the
    diagonal; `scale` 1.0 forgets 1/sqrt(d)."""
    def __init__(self, scale=None, shift=0, score_mod=False):
        super().__init__()
        self.c_attn, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.scale, self.shift, self.score_mod = scale, shift, score_mod

    def forward(self, x, keep=None):
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).view(B, T, 3, HEADS, C // HEADS).permute(2, 0, 3, 1, 4)

        def causal(b, h, q_idx, kv_idx):
            return q_idx + self.shift >= kv_idx
        if self.score_mod:
            def mod(score, b, h, q_idx, kv_idx):
                ok = causal(b, h, q_idx, kv_idx)
                return torch.where(ok if keep is None else ok & keep[b, kv_idx], score, -float("inf"))
            y = flex_attention(q, k, v, score_mod=mod, scale=self.scale)
        else:
            mask_mod = causal if keep is None else and_masks(causal, lambda b, h, q_idx, kv_idx: keep[b, kv_idx])
            bm = create_block_mask(mask_mod, None if keep is None else B, None, T, T, device="cpu", BLOCK_SIZE=8)
            y = flex_attention(q, k, v, block_mask=bm, scale=self.scale)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class FlexLM(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.emb, self.attn, self.head = nn.Embedding(32, C), FlexAttention(**kw), nn.Linear(C, 32)

    def forward(self, idx, attention_mask=None):
        h = self.emb(idx)
        return self.head(h + self.attn(h, None if attention_mask is None else attention_mask.bool()))


class SdpaAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).view(B, T, 3, HEADS, C // HEADS).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class InferenceLM(nn.Module):
    """Meta's Llama model.py: the forward decorated with torch.inference_mode."""
    def __init__(self):
        super().__init__()
        self.emb, self.attn, self.head = nn.Embedding(32, C), SdpaAttention(), nn.Linear(C, 32)

    @torch.inference_mode()
    def forward(self, idx):
        h = self.emb(idx)
        return self.head(h + self.attn(h))


CHECKS = ["eval_dropout", "future_leak", "self_visibility", "padding", "amplified_logits", "low_precision",
          "score_scale"]


def _lm(**kw):
    torch.manual_seed(0)
    return FlexLM(**kw)


def test_a_flex_call_is_recorded_with_its_scores_measured_densely():
    """The probe sees flex_attention called through a module's global and through torch's module
    attribute; the scores are q k^T * scale with the score_mod applied and -inf where the mask_mod
    hides a key (create_mask's mask); the reference recomputed from them is flex's output."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 8, 4) for _ in range(3))
    keep = torch.ones(2, 8, dtype=torch.bool)
    keep[0, :3] = False

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & keep[b, kv_idx]

    def alibi(score, b, h, q_idx, kv_idx):
        return score - 0.5 * (h + 1) * (q_idx - kv_idx)
    bm = create_block_mask(mask_mod, 2, None, 8, 8, device="cpu", BLOCK_SIZE=4)
    with Probe() as p:
        out = flex_attention(q, k, v, score_mod=alibi, block_mask=bm, scale=0.3)
        fa_module.flex_attention(q, k, v)
        kept = flex_attention   # the probe's wrapper, kept past the probe (as a torch.compile of it would be)
    assert flex_attention is fa_module.flex_attention, "the names are restored after the probe"
    assert kept is not flex_attention and torch.equal(kept(q, k, v), flex_attention(q, k, v))
    assert len(p.calls) == 2, "a wrapper kept past its probe passes calls through, unrecorded"
    assert [c.source for c in p.calls] == ["flex", "flex"]
    c = p.calls[0]
    dense = create_mask(mask_mod, 2, 2, 8, 8, device="cpu")
    assert torch.equal(c.visible, dense)
    h = torch.arange(2)[:, None, None] + 1.0
    want = (q.double() @ k.double().transpose(-2, -1)) * 0.3 - 0.5 * h * (torch.arange(8)[:, None] - torch.arange(8))
    assert torch.allclose(c.scores[dense], want.expand_as(c.scores)[dense])
    assert c.scale == 0.3 and c.complete and c.fused
    live = dense.any(-1)
    assert torch.allclose(c.reference(torch.float64)[live], out.double()[live], atol=1e-5)
    assert float(c.weights[~live].abs().sum()) == 0.0   # a row with no visible key: 0, as flex returns
    assert p.calls[1].scale == 0.5 and bool(p.calls[1].visible.all())


def test_a_healthy_flex_lm_passes_what_forward_only_can_measure():
    """A 1-layer flex LM (mask_mod and score_mod): its calls seen, its q/k site measured through
    the graph up to q and k (flex has no backward on CPU), the score checks pass; only the
    gradient half is inconclusive, naming the refusal; never target_raised."""
    for kw in ({}, {"score_mod": True}):
        r = examine(_lm(**kw), checks=CHECKS)
        assert r.info["attention_calls"] == {"flex": 1} and r.info["qk_sites"] == 1, r.info
        assert not r.failed, r.table()
        for name in ("self_visibility", "padding", "amplified_logits", "low_precision", "score_scale"):
            assert r[name].outcome == "pass", (kw, name, r[name].reason, r[name].detail)
        assert r["future_leak"].cause == "part_not_run" and "refuses autograd" in r["future_leak"].reason


@pytest.mark.parametrize("kw, check, cause", [
    ({"scale": 1.0}, "score_scale", "too_large"),
    ({"shift": -1}, "self_visibility", "own_key_masked"),
    ({"scale": 1.0, "score_mod": True}, "score_scale", "too_large"),
    ({"shift": -1, "score_mod": True}, "self_visibility", "own_key_masked"),
])
def test_flex_bugs_fail_their_check(kw, check, cause):
    r = examine(_lm(**kw), checks=["eval_dropout", check])
    assert r[check].outcome == "fail" and r[check].cause == cause, (r[check].reason, r[check].detail)


def test_an_inference_mode_forward_runs_every_check_and_raises_nothing():
    """A forward under torch.inference_mode (Meta's Llama): every check runs or says why, no
    doctor error, no target_raised; its q/k site is found by the registry and measured."""
    torch.manual_seed(0)
    r = examine(InferenceLM(), strict=True)
    assert not r.failed, r.table()
    assert not any(c.cause in ("doctor_error", "target_raised") for c in r.checks), r.table()
    assert r["score_scale"].outcome == r["self_visibility"].outcome == r["amplified_logits"].outcome == "pass"


class CachedLM(nn.Module):
    """gpt-fast's flex branch: setup_caches(max_batch_size, max_seq_length) puts a cache in the layer,
    a 1-D input_pos; a padding mask with the cache set up is refused (ValueError)."""
    def __init__(self):
        super().__init__()
        self.emb, self.qkv, self.head = nn.Embedding(32, C), nn.Linear(C, 3 * C), nn.Linear(C, 32)
        self.cache = None

    def setup_caches(self, max_batch_size, max_seq_length):
        self.cache = nn.Module()
        self.cache.register_buffer("k", torch.zeros(max_batch_size, max_seq_length, C))
        self.cache.register_buffer("v", torch.zeros(max_batch_size, max_seq_length, C))

    def forward(self, idx, input_pos=None, attention_mask=None):
        if attention_mask is not None and self.cache is not None:
            raise ValueError("a padding mask with the KV cache is not supported")
        B, T = idx.shape
        pos = torch.arange(T) if input_pos is None else input_pos
        q, k, v = self.qkv(self.emb(idx)).split(C, -1)
        keep = pos[:, None] >= torch.arange(T)[None]
        if self.cache is not None:
            self.cache.k[:B, pos], self.cache.v[:B, pos] = k, v
            k, v = self.cache.k[:B], self.cache.v[:B]
            keep = pos[:, None] >= torch.arange(k.shape[1])[None]
        if attention_mask is not None:
            keep = keep & attention_mask.bool()[:, None, :] | torch.eye(T, dtype=torch.bool)
        return self.head(F.scaled_dot_product_attention(q, k, v, attn_mask=keep))


def test_a_cache_set_up_by_one_check_is_gone_for_the_next():
    """kv_cache sets the cache up; padding, after it, gets the target as given (the same outcome as
    alone), not one that refuses its mask."""
    torch.manual_seed(0)
    model = CachedLM()
    r = examine(model, checks=["eval_dropout", "kv_cache", "padding"], strict=True)
    assert r["kv_cache"].outcome == "pass", r["kv_cache"].detail
    assert r["padding"].outcome == "pass", r["padding"].detail
    assert model.cache is None
