"""Caches, masks and positions of the common conventions, found by trying what a forward accepts
(issue 44 items 1 and 5), each on a tiny LM written here in the pattern, not the styles bed's
models: a set-up method with its own signature then input_pos and a mask over the cache
(torchtune's manner), a cache object passed in that the caller advances (Megatron's
InferenceParams, sequence-first hidden states, a square mask True = masked out), a cache object
that keeps its own lengths (mistral-inference's), a PyTorch key_padding_mask (True = ignore); a
cache the doctor sees and cannot drive is inconclusive, and only a model with none is n/a."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_doctor import examine
from attention_doctor.module_state import Snapshot

V, D, H, MAXLEN = 32, 16, 2, 64


class Tiny(nn.Module):
    """One attention layer over token and learned position embeddings; the attention itself is
    each pattern's."""
    n_layers = 1

    def __init__(self, bug=None):
        super().__init__()
        self.bug, self.n_heads, self.head_dim = bug, H, D // H
        self.emb, self.pos_emb = nn.Embedding(V, D), nn.Embedding(MAXLEN, D)
        self.qkv, self.proj, self.head = nn.Linear(D, 3 * D), nn.Linear(D, D), nn.Linear(D, V)

    def heads(self, h):
        """(B, S, D) -> q, k, v (B, H, S, d)."""
        B, S, _ = h.shape
        return self.qkv(h).view(B, S, 3, H, D // H).permute(2, 0, 3, 1, 4)

    def out(self, h, y):
        return self.head(h + self.proj(y.transpose(1, 2).reshape(h.shape)))


def keep_rows(start, n, length):
    """(n, length) bool: the causal rows start..start+n over `length` keys."""
    return torch.arange(length)[None, :] <= torch.arange(start, start + n)[:, None]


# -- torchtune's manner: setup_caches(batch_size, dtype, decoder_max_seq_len=...), then input_pos and
# a (B, S, L) mask required under the cache; a (B, S, S) keep mask with the causal part otherwise
class KVCache(nn.Module):
    def __init__(self, batch_size, max_seq_len, dtype):
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(batch_size, H, max_seq_len, D // H, dtype=dtype))
        self.register_buffer("v_cache", torch.zeros(batch_size, H, max_seq_len, D // H, dtype=dtype))
        self.size = 0

    def update(self, k, v):
        n = k.shape[2]
        self.k_cache[:, :, self.size:self.size + n] = k
        self.v_cache[:, :, self.size:self.size + n] = v
        self.size += n
        return self.k_cache, self.v_cache


class SetupLM(Tiny):
    def __init__(self, bug=None):
        super().__init__(bug)
        self.kv_cache = None

    def setup_caches(self, batch_size, dtype, *, encoder_max_seq_len=None, decoder_max_seq_len=None):
        self.kv_cache = KVCache(batch_size, decoder_max_seq_len or MAXLEN, dtype)

    def forward(self, tokens, *, mask=None, input_pos=None):
        cached = self.kv_cache is not None
        if cached and (mask is None or input_pos is None):
            raise ValueError("caches are set up: mask and input_pos are required")
        S = tokens.shape[1]
        pos = torch.arange(S) if input_pos is None or (cached and self.bug == "positions_from_zero") else input_pos
        h = self.emb(tokens) + self.pos_emb(pos)
        q, k, v = self.heads(h)
        if cached:
            k, v = self.kv_cache.update(k, v)
        keep = torch.ones(S, S, dtype=torch.bool).tril()[None] if mask is None else mask
        return self.out(h, F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None]))


@pytest.mark.parametrize("bug", [None, "positions_from_zero"])
def test_a_set_up_method_with_its_own_signature_then_input_pos_and_a_mask(bug):
    torch.manual_seed(0)
    m = SetupLM(bug).eval()
    r = examine(m, checks=["eval_dropout", "kv_cache", "padding"], strict=True)
    conv = r.info["conventions"]
    assert conv["cache"].startswith("setup_caches(batch_size, decoder_max_seq_len, dtype), then a 1-D input_pos "
                                    "and mask as keep (B, S, L)"), conv
    assert conv["mask"] == "mask as causal bool (B, T, T) (found by measurement)"
    assert r["kv_cache"].verdict == ("pass" if bug is None else "fail"), r.table() + r.details()
    if bug:
        assert r["kv_cache"].cause == "new_tokens_differ"
    # the padding check ran after the cache check on the model as it was built: no cache left behind
    assert r["padding"].verdict in ("pass", "warn"), r.table() + r.details()
    assert m.kv_cache is None


def test_a_snapshot_puts_back_only_what_the_set_up_changed():
    m = SetupLM()
    snap = Snapshot(m)
    m.setup_caches(2, torch.float32)
    snap.capture()
    m.train()   # the doctor's own change after the set-up stays
    snap.restore()
    assert m.kv_cache is None and "kv_cache" not in m._modules and m.training


# -- Megatron's manner: [s, b, h] hidden states, attention_mask bool True = masked out (b, 1, s, s) with
# the causal part, a cache object passed in whose sequence_len_offset the caller advances
class InferenceParams:
    def __init__(self, max_batch_size, max_sequence_length):
        self.max_batch_size, self.max_sequence_length = max_batch_size, max_sequence_length
        self.sequence_len_offset = self.batch_size_offset = 0
        self.key_value_memory_dict = {}


class SequenceFirstLM(Tiny):
    def forward(self, input_ids, position_ids=None, attention_mask=None, inference_params=None):
        b, s = input_ids.shape
        offset = 0 if inference_params is None else inference_params.sequence_len_offset
        if position_ids is None:
            position_ids = torch.arange(offset, offset + s)[None].expand(b, s)
        if attention_mask is None or self.bug == "mask_ignored":
            attention_mask = ~torch.ones(offset + s, offset + s, dtype=torch.bool).tril()[None, None]
        h = (self.emb(input_ids) + self.pos_emb(position_ids)).transpose(0, 1)   # [s, b, h]
        q, k, v = self.qkv(h).view(s, b, H, 3 * (D // H)).split(D // H, dim=-1)   # [s, b, np, hn]
        if inference_params is not None:
            mem = inference_params.key_value_memory_dict
            if "kv" not in mem:
                shape = (inference_params.max_sequence_length, inference_params.max_batch_size, H, D // H)
                mem["kv"] = (torch.zeros(shape, dtype=k.dtype), torch.zeros(shape, dtype=v.dtype))
            km, vm = mem["kv"]
            km[offset:offset + s, :b], vm[offset:offset + s, :b] = k, v
            k, v = km[:offset + s, :b], vm[:offset + s, :b]
            attention_mask = attention_mask[..., offset:offset + s, :offset + s]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))   # [b, np, s, hn]
        scores = (q @ k.transpose(-2, -1) / math.sqrt(D // H)).masked_fill(attention_mask, torch.finfo(q.dtype).min)
        y = scores.softmax(-1) @ v
        return self.out(h.transpose(0, 1), y)


@pytest.mark.parametrize("bug", [None, "mask_ignored"])
def test_a_sequence_first_model_with_its_square_mask_and_a_cache_object_the_caller_advances(bug):
    torch.manual_seed(0)
    r = examine(SequenceFirstLM(bug).eval(), checks=["eval_dropout", "kv_cache", "padding"], strict=True)
    conv = r.info["conventions"]
    assert conv["cache"].startswith("inference_params=InferenceParams(max_batch_size, max_sequence_length) passed "
                                    "in, its sequence_len_offset advanced by the caller"), conv
    assert r["kv_cache"].verdict == "pass", r.table() + r.details()
    if bug is None:
        assert conv["mask"] == "attention_mask as causal bool, True = masked (B, 1, T, T) (found by measurement)"
        assert r["padding"].verdict in ("pass", "warn"), r.table() + r.details()   # warn: positions from the padding
    else:   # it takes a mask under every encoding and ignores it: a fail, never n/a
        assert r["padding"].verdict == "fail" and r["padding"].cause == "mask_ignored", r.table() + r.details()


# -- mistral-inference's manner: a cache object passed in that keeps its own lengths
class LengthsCache:
    def __init__(self, n_layers, max_batch_size, max_seq_len, n_heads, head_dim):
        self.k = torch.zeros(n_layers, max_batch_size, n_heads, max_seq_len, head_dim)
        self.v = torch.zeros(n_layers, max_batch_size, n_heads, max_seq_len, head_dim)
        self.length = 0

    def to(self, device, dtype):
        self.k, self.v = self.k.to(device, dtype), self.v.to(device, dtype)
        return self


class OwnLengthsLM(Tiny):
    def forward(self, input_ids, cache=None):
        B, S = input_ids.shape
        n = 0 if cache is None else cache.length
        h = self.emb(input_ids) + self.pos_emb(torch.arange(n, n + S))
        q, k, v = self.heads(h)
        if cache is not None:
            cache.k[0, :B, :, n:n + S], cache.v[0, :B, :, n:n + S] = k, v
            k, v = cache.k[0, :B, :, :n + S], cache.v[0, :B, :, :n + S]
            cache.length += S - 1 if self.bug == "cache_off_by_one" else S
        return self.out(h, F.scaled_dot_product_attention(q, k, v, attn_mask=keep_rows(n, S, n + S)))


@pytest.mark.parametrize("bug", [None, "cache_off_by_one"])
def test_a_cache_object_that_keeps_its_own_lengths(bug):
    torch.manual_seed(0)
    r = examine(OwnLengthsLM(bug).eval(), checks=["eval_dropout", "kv_cache"], strict=True)
    assert r.info["conventions"]["cache"].startswith(
        "cache=LengthsCache(head_dim, max_batch_size, max_seq_len, n_heads, n_layers) passed in (found by trying")
    assert r["kv_cache"].verdict == ("pass" if bug is None else "fail"), r.table() + r.details()
    if bug:
        assert r["kv_cache"].cause == "new_tokens_differ"


# -- a cache the doctor sees and cannot drive, and none at all
class HiddenCacheLM(Tiny):
    """Keeps a KVCache module it never exposes (no set-up method, no argument)."""
    def __init__(self):
        super().__init__()
        self.cache = KVCache(1, MAXLEN, torch.float32)

    def forward(self, idx):
        h = self.emb(idx) + self.pos_emb(torch.arange(idx.shape[1]))
        q, k, v = self.heads(h)
        return self.out(h, F.scaled_dot_product_attention(q, k, v, is_causal=True))


class NoCacheLM(HiddenCacheLM):
    def __init__(self):
        super().__init__()
        del self.cache


def test_a_cache_seen_but_not_driven_is_inconclusive_and_only_none_is_na():
    torch.manual_seed(0)
    r = examine(HiddenCacheLM().eval(), checks=["eval_dropout", "kv_cache"], strict=True)
    assert r["kv_cache"].outcome == "inconclusive" and r["kv_cache"].cause == "unreachable", r.table()
    assert "module cache (KVCache)" in r["kv_cache"].reason
    r = examine(NoCacheLM().eval(), checks=["eval_dropout", "kv_cache"], strict=True)
    assert r["kv_cache"].verdict.startswith("n/a: no KV cache"), r.table()


# -- PyTorch's key_padding_mask (True = ignore) under another name than attention_mask / mask
class KeyPaddingLM(Tiny):
    def forward(self, idx, key_padding_mask=None):
        T = idx.shape[1]
        h = self.emb(idx) + self.pos_emb(torch.arange(T))
        q, k, v = self.heads(h)
        keep = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
        if key_padding_mask is not None and self.bug != "mask_ignored":
            keep = keep & ~key_padding_mask[:, None, None, :]
        return self.out(h, F.scaled_dot_product_attention(q, k, v, attn_mask=keep))


@pytest.mark.parametrize("bug", [None, "mask_ignored"])
def test_a_key_padding_mask_is_found_and_an_ignored_one_fails(bug):
    torch.manual_seed(0)
    r = examine(KeyPaddingLM(bug).eval(), checks=["eval_dropout", "padding"], strict=True)
    if bug is None:
        assert r.info["conventions"]["mask"] == "key_padding_mask as bool, True = masked (B, T) (found by measurement)"
        assert r["padding"].verdict in ("pass", "warn"), r.table() + r.details()   # warn: positions from the padding
    else:
        assert r["padding"].verdict == "fail" and r["padding"].cause == "mask_ignored", r.table() + r.details()


class PackedLM(nn.Module):
    """mistral-inference's packed batch: the embedding takes the ids flattened, (B T,)."""
    def __init__(self, bug=None):
        super().__init__()
        self.bug, self.emb, self.qkv, self.head = bug, nn.Embedding(V, D), nn.Linear(D, 3 * D), nn.Linear(D, V)

    def forward(self, ids):
        B, T = ids.shape
        h = self.emb(ids.reshape(-1)).view(B, T, D)
        q, k, v = self.qkv(h).split(D, -1)
        keep = torch.ones(T, T, dtype=torch.bool).tril(1 if self.bug == "sees_next" else 0)
        return self.head(h + F.scaled_dot_product_attention(q, k, v, attn_mask=keep))


@pytest.mark.parametrize("bug", [None, "sees_next"])
def test_future_leak_takes_the_gradient_through_a_packed_embedding(bug):
    torch.manual_seed(0)
    r = examine(PackedLM(bug).eval(), checks=["eval_dropout", "future_leak"], strict=True)
    assert r["future_leak"].verdict == ("pass" if bug is None else "fail"), r.table() + r.details()
    assert "gradient: not run" not in r["future_leak"].detail


class RefusingCache:
    """A cache holder whose constructor refuses what the doctor can give it."""
    def __init__(self, max_batch_size, max_seq_len):
        raise KeyError("needs a config")


class RefusingCacheLM(HiddenCacheLM):
    def forward(self, idx, kv_cache=None):
        return super().forward(idx)


def test_a_cache_class_that_refuses_is_inconclusive_and_not_the_doctors_error():
    torch.manual_seed(0)
    r = examine(RefusingCacheLM().eval(), checks=["eval_dropout", "future_leak", "kv_cache"], strict=True)
    assert r["future_leak"].verdict == "pass", r.table()
    assert r["kv_cache"].outcome == "inconclusive" and r["kv_cache"].cause == "unreachable", r.table()
    assert "RefusingCache(max_batch_size, max_seq_len) passed in: KeyError" in r.info["conventions"]["cache"]
