"""kv_cache on caches written by hand, driven bare (issue 61 item 5), on the tiny models of
doctor_lab/hand_caches: a cache object of the model's own class passed as kv_cache= (nanochat's
manner, its num_heads the key/value heads, found among the model's integers by which one runs;
nanochat#756's multi-token step caught), the presents a forward returns and takes back (per layer
(k, v) or a latent and a rope key, in a tuple or a NamedTuple), and a forward that needs input_pos
behind setup_caches (gpt-fast's model.py). Each healthy passes, each planted cache bug fails
kv_cache with new_tokens_differ, and the caller's model is left as it was given."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attention_doctor import examine
from attention_doctor.cache_params import annotated_classes, guesses
from attention_doctor.presents import output_parts, time_axes
from doctor_lab.hand_caches import input_pos, own_cache, presents

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ["eval_dropout", "kv_cache"]


def kv(model):
    r = examine(model, checks=CHECKS, strict=True)
    return r["kv_cache"], r.info["conventions"]


@pytest.mark.parametrize("bug", [None, *own_cache.PLANTED])
def test_a_cache_object_of_the_models_own_class_with_its_kv_heads_guessed(bug):
    row, conv = kv(own_cache.build(bug))
    assert conv["cache"].startswith("kv_cache=KVCache(batch_size, device, dtype, head_dim, num_heads=n_kv_head, "
                                    "num_layers, seq_len) passed in"), conv
    if bug is None:
        assert row.outcome == "pass" and row.measured <= 1e-5, row.detail
    else:
        assert row.outcome == "fail" and row.cause == "new_tokens_differ", row.detail
    if bug == "chunk_smear":   # nanochat#756: one new token is right, three after the prefill are not
        one, three = row.measurements["trials"]
        assert one["new"] <= 1e-5 and three["new"] > 1e-2, row.measurements


@pytest.mark.parametrize("bug", [None, "cache_top_left"])
def test_a_cache_read_only_where_zero_output_projections_are_filled(bug):
    """nanochat's init: every output projection zero, so no output shows the prompt and no way of
    driving the cache can be seen to read it on the model itself; on the doctor's copy with those
    matrices filled it is, and the bug shows there."""
    model = presents.build("kv", bug)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.out.weight.zero_()
            block.mlp[2].weight.zero_()
    r = examine(model, checks=CHECKS, strict=True)
    row, conv = r["kv_cache"], r.info["conventions"]
    # filled before the conventions are found where a plain forward runs (examination._sensitive_first),
    # else on the cache's own copy (caches.py): either way said
    filled = "zero weight matrices filled" in conv["cache"] or "attn.out.weight" in str(r.info["filled_zero_weights"])
    assert conv["cache"].startswith("past_key_values= the presents") and filled, (conv, r.info)
    assert row.outcome == ("pass" if bug is None else "fail"), row.detail
    assert not model.blocks[0].attn.out.weight.any()   # the caller's model as it was given


def test_the_guesses_are_the_models_integers_that_share_the_parameters_words():
    model = own_cache.build()
    assert [n for n, _ in guesses(model, "num_heads")] == ["n_kv_head", "n_head"]   # head_dim: the value of n_head
    assert guesses(model, "num_widgets") == []


class Cache:
    pass


def test_a_cache_class_named_by_the_forwards_annotation():
    class M(torch.nn.Module):
        def forward(self, idx, cache: "Cache | None" = None, other: torch.Tensor | None = None):
            return idx
    assert annotated_classes(M(), "cache") == [Cache]
    assert annotated_classes(M(), "other") == []   # torch's own classes are no cache holder

    class Defaulted(torch.nn.Module):
        def forward(self, idx, state=Cache(), n=3):
            return idx
    assert annotated_classes(Defaulted(), "state") == [Cache] and annotated_classes(Defaulted(), "n") == []


@pytest.mark.parametrize("layout", presents.LAYOUTS)
@pytest.mark.parametrize("bug", [None, *presents.PLANTED])
def test_presents_returned_and_passed_back(layout, bug):
    row, conv = kv(presents.build(layout, bug))
    assert conv["cache"].startswith("past_key_values= the presents it returns (part 1 after the logits, with "
                                    "use_cache=True: 2 layer(s) of 2 tensor(s) along the tokens, grown by each call)"), conv
    if bug is None:
        assert row.outcome == "pass" and row.measured <= 1e-5, row.detail
    else:
        assert row.outcome == "fail" and row.cause == "new_tokens_differ", row.detail


def test_the_presents_are_found_by_their_time_axis():
    model = presents.build("latent")
    out = model(torch.zeros(2, 5, dtype=torch.long), use_cache=True)
    parts = output_parts(out)
    assert len(parts) == 1 and time_axes(parts[0], 5) == [[{1}, {1}], [{1}, {1}]]   # (B, T, d_c), (B, T, 1, d_r)
    assert time_axes(parts[0], 7) is None
    olmo = presents.build("olmo")(torch.zeros(2, 5, dtype=torch.long), use_cache=True)
    assert len(output_parts(olmo)) == 2 and output_parts(olmo)[1] is None   # the NamedTuple's fields after logits


@pytest.mark.parametrize("bug", [None, *input_pos.PLANTED])
def test_a_forward_that_needs_input_pos_behind_setup_caches(bug):
    model = input_pos.build(bug)
    with pytest.raises(AssertionError):   # a plain call raises, as gpt-fast's model.py does
        model(torch.zeros(2, 16, dtype=torch.long))
    row, conv = kv(model)
    assert conv["plain call"].startswith("setup_caches(batch, length), then input_pos 0..T-1 (without them its "
                                         "forward raised: AssertionError: Caches must be initialized first"), conv
    if bug is None:
        assert row.outcome == "pass" and row.measured <= 1e-5, row.detail
    else:
        assert row.outcome == "fail" and row.cause == "new_tokens_differ", row.detail
    assert model.freqs_cis is None and model.max_batch_size == -1   # the caller's model as it was given
    assert all(b.attention.kv_cache is None for b in model.layers)


def test_the_needed_positions_do_not_leak_between_batches():
    """A cache set up for one call is put back after it: a batch of 16 then one row (batch_independence)
    does not meet the larger cache (whose every row the target writes)."""
    r = examine(input_pos.build(), checks=["eval_dropout", "batch_independence", "low_precision"], strict=True)
    assert r["batch_independence"].outcome == "pass", r["batch_independence"].detail
    # its cache is float32 and takes no bfloat16 write under autocast: its limit, named, as the styles bed's gpt_fast
    assert r["low_precision"].outcome == "inconclusive" and "kv_cache.k_cache" in r["low_precision"].reason


def test_nanochat_756_caught_bare_from_the_command_line():
    p = subprocess.run([sys.executable, "-m", "attention_doctor", "doctor_lab/hand_caches/own_cache.py:chunk_smear",
                        "--checks", "eval_dropout,kv_cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "kv_cache" in p.stdout and "new_tokens_differ" in p.stdout and "Traceback" not in p.stderr, p.stdout


class RequiredPositionsLM(presents.LM):
    """Position ids the forward requires (no default); with a cache the caller counts them on."""

    def forward(self, idx, position_ids, past_key_values=None, use_cache=False):
        x, out = self.wte(idx), []
        for i, block in enumerate(self.blocks):
            x, present = block(x, position_ids[0], None if past_key_values is None else past_key_values[i])
            out.append(present)
        return self.head(self.ln_f(x)), tuple(out)


@pytest.mark.parametrize("bug", [None, "cache_top_left"])
def test_position_ids_a_forward_requires_are_given(bug):
    torch.manual_seed(0)
    r = examine(RequiredPositionsLM("kv", bug).eval(), checks=["eval_dropout", "future_leak", "kv_cache"], strict=True)
    assert r["future_leak"].outcome == "pass", r["future_leak"].detail
    assert r["kv_cache"].outcome == ("pass" if bug is None else "fail"), r["kv_cache"].detail
