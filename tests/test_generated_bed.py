"""The generated styles bed (doctor_lab/generated): its expected outcomes derived right on hand-checked
cases, its models built as their records say (checked by measurement here, not by the doctor), and a
shrunk run: every sampled combination gets its expected outcome or a miss whose reason is recorded."""
import json

import pytest
import torch

from doctor_lab.generated import combos, records, triage
from doctor_lab.generated.combos import HEALTHY, Combo, Style, bug_fits, expected, valid
from doctor_lab.generated.lm import build

BASE = "matmul,separate,bool,layer,softmax,learned,none,default,d32_l2"


def style(**over) -> Style:
    names = dict(zip(records.AXES, BASE.split(",")))
    names.update(over)
    return Style.parse(",".join(names[a] for a in records.AXES))


def rows(style_, bug):
    return {(e.check, e.outcome, tuple(sorted(e.causes))) for e in expected(style_, bug).rows}


# -- the derivation, hand-checked ---------------------------------------------------------------

def test_healthy_expects_no_row_and_the_construction_na():
    e = expected(style(), HEALTHY)
    assert e.rows == ()
    assert set(e.na) == {"sliding_window", "path_agreement", "config_roundtrip", "kv_cache"}
    assert "kv_cache" not in expected(style(cache="start_pos"), HEALTHY).na


def test_a_value_moves_a_bugs_rows():
    assert rows(style(), "dropout_in_eval") == {("eval_dropout", "fail", ("random_in_eval",))}
    assert rows(style(scores="sdpa"), "dropout_in_eval") == {("eval_dropout", "fail", ("sdpa_dropout_p",))}
    # left padding's positions: a warn where the caller can pass position ids, a fail where start_pos is all it takes
    assert rows(style(), "left_pad_positions") == {("padding", "warn", ("positions_from_padding",))}
    assert rows(style(cache="start_pos"), "left_pad_positions") == {("padding", "fail", ("left_padding",))}


def test_a_feature_adds_a_consequence():
    # the diagonal masked with a -inf additive mask and a softmax: the first query has no key, NaN
    assert ("finite_output", "fail", ("nonfinite_output",)) in rows(style(mask="additive_neginf"), "off_by_one")
    assert rows(style(mask="bool"), "off_by_one") == {("self_visibility", "fail", ("own_key_masked",))}
    assert ("finite_output", "fail", ("nonfinite_output",)) not in rows(
        style(mask="additive_neginf", norm="sigmoid"), "off_by_one")


def test_validity_comes_from_the_records():
    assert not valid(style(scores="sdpa", norm="sigmoid"))        # sigmoid needs weights of its own
    assert not valid(style(scores="flex", mask="additive_min"))   # flex masks through its score_mod
    assert valid(style(scores="flex", mask="tril"))
    assert not bug_fits(style(scores="sdpa"), "neg_inf_fill")     # SDPA gives 0 for a fully masked row
    assert not bug_fits(style(norm="sinks"), "neg_inf_fill")      # a sink keeps every row finite
    assert not bug_fits(style(), "cache_top_left")                # no cache
    assert bug_fits(style(cache="presents"), "cache_top_left")
    assert not bug_fits(style(positions="alibi"), "left_pad_positions")
    # ALiBi's query index off by a constant shifts a whole row alike: only weights that see that show it
    assert not bug_fits(style(cache="start_pos", positions="alibi"), "cache_positions_from_zero")
    assert bug_fits(style(cache="start_pos", positions="alibi", norm="sigmoid"), "cache_positions_from_zero")
    assert bug_fits(style(cache="start_pos", positions="rope_real"), "cache_positions_from_zero")
    assert not bug_fits(style(scores="flex"), "dropout_in_eval")
    # where no output can show a bug (measured below), the records leave it out
    assert not bug_fits(style(norm="sinks"), "finite_mask")       # the sink takes a row the fill could
    assert bug_fits(style(norm="differential"), "finite_mask")
    for mask in ("bool", "tril"):                                 # sigmoid is 0 or 1 where q k^T overflows
        assert not bug_fits(style(norm="sigmoid", mask=mask), "scale_after")
        assert bug_fits(style(norm="sinks", mask=mask), "scale_after")
    assert bug_fits(style(norm="sigmoid", mask="additive_min"), "scale_after")
    assert all(b.fit_why for b in records.BUGS_LIST if b.needs_one_of or b.excludes)


def test_the_population_counts_by_hand():
    # own notations: every value of every axis; sdpa: softmax only; flex: softmax, bool or tril masks
    free = 4 * 4 * 2 * 4 * 4 * 2 * 2                       # qkv, mask, mask_at, positions, cache, init, size
    assert len(combos.all_styles()) == 4 * free * 4 + free + free // 2
    pop = combos.population()
    assert len(pop["left_pad_positions"]) == len(pop[HEALTHY]) // 4   # learned positions only


def test_sample_is_seeded_and_spread():
    a, b = combos.sample(120, seed=3), combos.sample(120, seed=3)
    assert [c.id for c in a] == [c.id for c in b] and len(a) == 120
    assert {c.bug for c in a} == {HEALTHY, *records.BUGS}
    assert all(Combo.parse(c.id) == c for c in a[:10])
    with pytest.raises(ValueError):
        Combo.parse(BASE + "/not_a_bug")


def test_a_reasons_twin_swaps_out_what_it_blames():
    c = Combo(style(cache="presents"), "cache_top_left")
    miss = {"kind": "missed", "check": "kv_cache", "got": "inconclusive (unreachable)"}
    reason = triage.reason_of(c, miss)
    assert reason.name == "presents_cache_unreachable"
    assert triage.twin_of(c, reason) == Combo(style(cache="intermediates"), "cache_top_left")
    # a swap that makes the combination invalid has no twin (flex takes no additive mask)
    flex = Combo(style(scores="flex"), "finite_mask")
    r = triage.reason_of(flex, {"kind": "missed", "check": "amplified_logits", "got": "pass"})
    assert r.name == "finite_fill_not_reached" and triage.twin_of(flex, r) is None
    assert triage.reason_of(Combo(style(), "no_scaling"), {"kind": "missed", "check": "score_scale", "got": "pass"}) is None
    # a pair examined before its fit rule left it out: the construction's
    sinks = Combo(style(norm="sinks"), "finite_mask")
    r = triage.reason_of(sinks, {"kind": "missed", "check": "amplified_logits", "got": "pass"})
    assert (r.name, r.whose) == ("ruled_out_since", triage.CONSTRUCTION)


def test_the_docs_tables_are_the_records():
    from pathlib import Path

    from doctor_lab.generated import docs
    text = (Path(__file__).resolve().parents[1] / "docs" / "doctor.md").read_text()
    assert docs.render(text) == text, "python -m doctor_lab.generated.docs docs/doctor.md"
    assert f"| positions | alibi | {records.VALUES['positions=alibi'].what} |" in docs.axes_table()
    with pytest.raises(ValueError):
        docs.render("no markers here")


# -- the models do what their records say (measured here, without the doctor) ----------------

def _logits(model, ids, **kw):
    with torch.no_grad():
        out = model(ids, **kw)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("scores", ["matmul", "einsum_bqhk", "bmm", "sdpa"])
def test_future_tokens_move_earlier_outputs_only_with_a_leak(scores):
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    later = ids.clone()
    later[:, 8:] = (later[:, 8:] + 1) % 64
    for bug, leaks in ((HEALTHY, False), ("sees_next", True), ("no_transpose_merge", True)):
        m = build(style(scores=scores, positions="rope_real"), bug)
        moved = (_logits(m, ids) - _logits(m, later))[:, :8].abs().max().item()
        assert (moved > 1e-4) is leaks, (scores, bug, moved)


@pytest.mark.parametrize("cache", ["start_pos", "intermediates", "presents"])
def test_a_healthy_cache_step_is_the_full_forward_and_a_cache_bug_is_not(cache):
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    for bug, same in ((HEALTHY, True), ("cache_top_left", False), ("cache_off_by_one", False),
                      ("cache_positions_from_zero", False)):
        m = build(style(cache=cache, positions="rope_complex"), bug)
        full = _logits(m, ids)[:, -3:]
        with torch.no_grad():
            if cache == "start_pos":
                m(ids[:, :13], start_pos=0)
                step = m(ids[:, 13:], start_pos=13)
            elif cache == "intermediates":
                _, kv = m(ids[:, :13], return_intermediates=True)
                step = m(ids, cache=kv, return_intermediates=True, cache_age=3)[0]
            else:
                _, kv = m(ids[:, :13], use_cache=True)
                step = m(ids[:, 13:], past_key_values=kv, use_cache=True)[0]
        assert torch.allclose(full, step, atol=1e-5) is same, (cache, bug)


@pytest.mark.parametrize("norm", ["softmax", "sigmoid", "sinks", "differential"])
@pytest.mark.parametrize("positions", ["rope_real", "rope_complex", "alibi", "learned"])
def test_left_padding_leaves_a_healthy_models_real_outputs(norm, positions):
    # relative positions are shift-invariant, learned ones count from the first real token; a
    # differential map that split a rotary pair would move here (it did, before DIFF_HALVES)
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(2))
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), ids], 1)
    keep = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 12, dtype=torch.long)], 1)
    for scores in ("matmul", "einsum_bqhk"):
        m = build(style(scores=scores, norm=norm, positions=positions), HEALTHY)
        moved = (_logits(m, ids) - _logits(m, padded, attention_mask=keep)[:, 4:]).abs().max().item()
        assert moved < 1e-5, (scores, moved)
        bugged = build(style(scores=scores, norm=norm, positions=positions), "mask_ignored")
        assert (_logits(bugged, ids) - _logits(bugged, padded, attention_mask=keep)[:, 4:]).abs().max() > 1e-4


def _amplified_logits(style_, bug, factor, dtype):
    """Logits (plain and left-padded batch) with every layer's q and k times factor, in dtype."""
    m = build(style_, bug)
    for blk in m.blocks:
        project = blk.attn.project
        blk.attn.project = lambda x, f=project: (lambda q, k, v: (q * factor, k * factor, v))(*f(x))
    m = m.to(dtype)
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    keep = torch.ones(2, 16, dtype=torch.long)
    keep[1, :5] = 0
    return torch.cat([_logits(m, ids), _logits(m, ids, attention_mask=keep)]).float()


@pytest.mark.parametrize("bug, over, dtype", [
    ("scale_after", {"norm": "sigmoid", "mask": "bool"}, torch.float16),
    ("scale_after", {"norm": "sigmoid", "mask": "tril", "scores": "bmm"}, torch.float16),
    ("finite_mask", {"norm": "sinks"}, torch.float32)])
def test_a_bug_its_fit_rule_leaves_out_cannot_show(bug, over, dtype):
    # the same bug where it fits (an additive mask; a softmax) moves the outputs at the same scores
    shown = {"scale_after": {**over, "mask": "additive_min"}, "finite_mask": {**over, "norm": "softmax"}}[bug]
    assert not bug_fits(style(**over), bug) and bug_fits(style(**shown), bug)
    for factor in (30, 300):
        hidden = _amplified_logits(style(**over), bug, factor, dtype) - _amplified_logits(style(**over), HEALTHY, factor, dtype)
        assert hidden.abs().max() == 0, (factor, hidden.abs().max())
    moved = _amplified_logits(style(**shown), bug, 300, dtype) - _amplified_logits(style(**shown), HEALTHY, 300, dtype)
    assert moved.abs().max() > 0.1


def test_zero_out_init_leaves_attention_without_effect():
    m = build(style(init="zero_out"), HEALTHY)
    assert all(b.attn.wo.weight.abs().sum() == 0 for b in m.blocks)
    assert m.blocks[0].attn.wo.weight.shape == (32, 32)


# -- a shrunk run ------------------------------------------------------------------------------

def test_a_shrunk_run_gets_each_expected_outcome_or_a_known_miss(tmp_path):
    from doctor_lab.generated import run
    from doctor_lab.report.sections import generated as section
    # 20 combinations of a seeded sample; flex's healthy runs (tens of seconds each, eager on CPU) left out
    picked = [c.id for c in combos.sample(300, seed=11)
              if not (c.style["scores"] == "flex" and c.bug == HEALTHY)][::15][:20]
    recs = run.run(picked, tmp_path / "out", log=lambda s: None)
    assert len(recs) == 20
    for r in recs:
        assert r["right"] or triage.reason_of(Combo.parse(r["id"]), r["miss"]) is not None, r
    ev = run.evidence(picked, recs, 20, 11, 1, 1.0)
    (tmp_path / "doctor").mkdir()
    (tmp_path / "doctor" / "generated.json").write_text(json.dumps(ev))
    text = section.blocks([], tmp_path / "figs")["generated"]
    bug = recs[0]["bug"]
    n_bug = sum(r["bug"] == bug for r in recs)
    assert f"{ev['right']}/20" in text and f"| {bug} | " in text and f"| {n_bug} | " in text
