"""The doctor on attention written in other notations (doctor_lab/styles/classic.py): each style healthy
passes every check it can run (the scale-after styles fail low_precision: q k^T overflows float16
before the scale), each catalogue bug fails the check that targets it, and the conventions the
styles use are found (targets, masks by name and encoding, positions, caches)."""
import math

import pytest
import torch
import torch.nn as nn

from attention_doctor import examine
from doctor_lab.styles import classic as S

SCALE_AFTER = {"nanogpt", "functional"}   # q k^T before the 1/sqrt(d_k): float16 overflows at ~3e4
RUN = {"nanogpt": 11, "einsum": 12, "functional": 12, "mha_subclass": 11}   # no cache / no paths by nature


@pytest.mark.parametrize("style", list(S.STYLES))
def test_healthy_style_fails_nothing_but_the_scale_after_order(style):
    r = examine(S.build(style), strict=True)
    failed = {c.name for c in r.failed}
    assert failed == ({"low_precision"} if style in SCALE_AFTER else set()), r.table() + "\n" + r.details()
    assert {(c.name, c.cause) for c in r.failed} == set(S.STYLES[style].HAZARDS)   # what the stability gate expects
    if style in SCALE_AFTER:   # the cause named: q k^T passes 65504 before the scale; the mask fill is fine
        assert r["low_precision"].cause == "qk_before_scale", r["low_precision"].detail
        assert "at scores ~1e3" not in r["low_precision"].detail
    assert not any(c.inconclusive for c in r.checks), r.table()   # n/a only where the style lacks the interface
    assert r.info["checks_run"] == RUN[style], r.table()
    assert not any(c.verdict == "warn" for c in r.checks), r.table()


@pytest.mark.parametrize("style,bug", [c for c in S.cases() if c[1] is not None], ids=lambda c: str(c))
def test_each_bug_fails_its_check_with_what_failed_measured(style, bug):
    want = S.BUGS[bug]
    r = examine(S.build(style, bug), checks=["eval_dropout", *want], strict=True)
    for c in want:
        assert r[c].verdict == ("warn" if S.warns(style, bug) else "fail"), f"{style}/{bug}: {c} {r[c].verdict}: {r[c].detail}"
    if bug == "scale_after":
        assert r["low_precision"].cause == "qk_before_scale"
    for c in r.failed:   # the number beside a fail is the thing that failed (none where the target raised)
        assert c.measured != 0 and (c.measured is not None or "raised" in c.detail), f"{c.name}: {c.measured}: {c.detail}"


def test_einsum_style_hand_made_softmax_is_seen():
    """The einsum style's calls are read from its einsums and its exp / sum: scores, weights, q, k, v."""
    r = examine(S.build("einsum"), checks=["eval_dropout", "self_visibility", "score_scale", "amplified_logits"], strict=True)
    assert r.info["qk_sites_measured"] == ["attn.0", "attn.1"]   # to_q | to_kv, found by autograd
    assert "score std per attention call" in r["score_scale"].detail
    assert "at 2 q/k site(s)" in r["amplified_logits"].detail


def test_conventions_are_found_and_reported():
    conv = {s: examine(S.build(s), checks=["eval_dropout"]).info["conventions"] for s in S.STYLES}
    assert conv["nanogpt"]["targets"].startswith("the forward returns the last position's logits")
    assert conv["nanogpt"]["mask"].startswith("attention_mask as 0/1 integers")
    assert conv["nanogpt"]["positions"].startswith("the ids fed to pos_table")
    assert conv["einsum"] == {"mask": "mask as bool (found by measurement)", "positions": "pos",
                              "cache": "cache= with return_intermediates=True"}
    assert conv["functional"]["mask"].startswith("mask as additive (B, T)")
    assert conv["functional"]["cache"] == "kept inside, written at start_pos"
    assert conv["mha_subclass"]["mask"].startswith("attention_mask as bool")


class OffsetOnly(nn.Module):
    """start_pos that moves the positions and keeps no cache: no kv_cache to check."""
    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(16, 8), nn.Linear(8, 16)

    def forward(self, tokens, start_pos=0):
        return self.head(self.emb(tokens) * (1 + start_pos))


def test_start_pos_without_a_cache_is_not_taken_for_one():
    r = examine(OffsetOnly(), checks=["eval_dropout", "kv_cache"], strict=True)
    assert r.info["conventions"]["start_pos"] == "moves the positions only (no cache behind it)"
    assert r["kv_cache"].verdict.startswith("n/a: no KV cache")


@pytest.mark.parametrize("bug", ["softmax_over_queries", "no_transpose_merge"])
def test_a_layer_whose_bug_reads_the_future_is_still_judged_causal(bug):
    """Softmax over the queries makes position 0 read position T-1: its masks say causal."""
    torch.manual_seed(0)
    r = examine(S.EinsumAttention(bug).eval(), checks=["eval_dropout", "future_leak"], strict=True)
    assert r.info["description"]["causal_from"] == "causal (found: its attention calls mask every later key)"
    assert r["future_leak"].verdict == "fail"


def test_a_layer_without_a_causal_mask_says_how_to_say_it_is():
    torch.manual_seed(0)
    r = examine(S.NanoAttention("no_causal_mask").eval(), checks=["eval_dropout", "future_leak"], strict=True)
    assert r["future_leak"].verdict.startswith("n/a: not causal (found: position 0 reads position T-1, and no "
                                               "attention call masks the later keys)")
    assert "causal=True, or --causal yes, if it is meant to be causal" in r["future_leak"].verdict
    r = examine(S.NanoAttention("no_causal_mask").eval(), causal=True, checks=["eval_dropout", "future_leak"], strict=True)
    assert r["future_leak"].verdict == "fail"


class KeepsWeights(nn.Module):
    """An attention layer that keeps its last weights (as the Annotated Transformer's does) and
    fills its mask with -1e9, which float16 cannot hold."""
    def __init__(self, d=16):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.attn = None

    def forward(self, x):
        T = x.shape[1]
        s = self.q(x) @ self.k(x).transpose(-2, -1) / math.sqrt(x.shape[-1])
        s = s.masked_fill(torch.ones(T, T, device=x.device).tril() == 0, -1e9)
        self.attn = s.softmax(-1)
        return self.attn @ self.v(x)


def test_a_module_keeping_its_activations_is_copied_and_its_float16_crash_fails():
    torch.manual_seed(0)
    r = examine(KeepsWeights(), causal=True, checks=["eval_dropout", "low_precision"], strict=True)
    assert r["low_precision"].verdict == "fail"
    assert "value cannot be converted to type c10::Half without overflow" in r["low_precision"].detail


class ClosureBlock(nn.Module):
    """A function kept as an attribute that closes over the module's parts (minGPT's mlpf)."""
    def __init__(self):
        super().__init__()
        self.emb, self.mlp, self.head = nn.Embedding(16, 8), nn.Linear(8, 8), nn.Linear(8, 16)
        m = self.mlp
        self.mlpf = lambda x: m(x)

    def forward(self, idx):
        return self.head(self.mlpf(self.emb(idx)))


def test_a_copy_rebinds_functions_closing_over_the_module():
    from attention_doctor.adapters import deep_copy
    m = ClosureBlock()
    c = deep_copy(m).half()
    assert c.mlpf.__closure__[0].cell_contents is c.mlp
    assert c(torch.zeros(1, 4, dtype=torch.long)).dtype == torch.float16


class InputPosLM(S.FunctionalLM):
    """LitGPT's convention on the functional style: input_pos needs a cache set up first."""
    cache_on = False

    def set_kv_cache(self, batch_size, device=None, dtype=None):
        self.cache_on = True

    def clear_kv_cache(self):
        self.cache_on = False

    def forward(self, idx, input_pos=None):
        if input_pos is None:
            return super().forward(idx)
        assert self.cache_on, "call set_kv_cache() first"
        return super().forward(idx, start_pos=int(input_pos[0]))


@pytest.mark.parametrize("bug", [None, "cache_top_left", "rope_bf16"])
def test_input_pos_with_a_cache_set_up_first(bug):
    torch.manual_seed(0)
    r = examine(InputPosLM(bug).eval(), checks=["eval_dropout", "kv_cache", "long_positions"], strict=True)
    assert r.info["conventions"]["cache"] == "set_kv_cache(batch_size), then a 1-D input_pos"
    # a causal mask aligned top-left against the cache also hides the new keys from the new queries at
    # +4096: long_positions, through the cache, sees that mask move with the shift
    want = {None: {}, "cache_top_left": {"kv_cache": "fail", "long_positions": "fail"},
            "rope_bf16": {"long_positions": "fail"}}[bug]
    assert {c.name: c.verdict for c in r.checks if c.verdict != "pass"} == want, r.table() + r.details()
    if bug == "cache_top_left":
        assert r["long_positions"].cause == "shift_moves_mask", r["long_positions"].detail


class KeywordSDPA(nn.Module):
    """nanoGPT's attention through SDPA with q, k, v by name (as diffusers' Flux processors call it)."""

    def __init__(self, bug):
        super().__init__()
        self.n_head, self.c_attn, self.c_proj = S.HEADS, nn.Linear(S.D, 3 * S.D), nn.Linear(S.D, S.D)

    def forward(self, x, pad=None):
        q, k, v = (S.heads(t, self.n_head) for t in self.c_attn(x).split(x.shape[-1], dim=2))
        y = torch.nn.functional.scaled_dot_product_attention(query=q, key=k, value=v, is_causal=True)
        return self.c_proj(S.merge(y, None))


def test_sdpa_called_with_q_k_v_by_name_is_seen():
    lm = S.NanoLM()
    lm.attn = nn.ModuleList(KeywordSDPA(None) for _ in lm.attn)
    r = examine(lm, checks=["eval_dropout", "score_scale", "amplified_logits"], strict=True)
    assert [c.verdict for c in r.checks] == ["pass"] * 3, r.table() + r.details()
    assert "score std per attention call" in r["score_scale"].detail
