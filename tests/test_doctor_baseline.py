"""Expected outcomes as data (attention_doctor/baseline.py): each row judged against its check's
entry, the exit code and assert_healthy following the baseline, a draft of today's non-passing
rows read back, bad files refused in one line, and the zoo's triage entries read as baseline
entries that judge the zoo's rows as the triage does. Torch-free except the examine() case."""
import json

import pytest

from attention_doctor.baseline import Baseline, Expected, Status, draft, from_triage, judge_row, read_result
from attention_doctor.result import DoctorResult, Row


def _result(*rows, target="pkg:model"):
    return DoctorResult(target, [Row(*r) for r in rows])


PADDING_FAIL = ("padding", "fail", "", "right_padding")
CACHE_PASS = ("kv_cache", "pass")
SCALE_BLIND = ("score_scale", "inconclusive", "no scores seen", "no_scores")


def test_each_row_is_judged_by_its_checks_entry_outcome_and_cause():
    expects = Expected("padding", ("right_padding",), "pads on the right are never read")
    assert judge_row(Row(*PADDING_FAIL), expects).status is Status.EXPECTED
    assert judge_row(Row("padding", "fail", "", "left_padding"), expects).status is Status.UNEXPECTED
    assert judge_row(Row("padding", "inconclusive", "why", "no_scores"), expects).status is Status.INCONCLUSIVE
    assert judge_row(Row("padding", "pass"), expects).status is Status.FIXED
    assert judge_row(Row("padding", "warn", "", "positions_from_padding"), expects).status is Status.FIXED
    assert judge_row(Row(*PADDING_FAIL), None).status is Status.UNEXPECTED
    assert judge_row(Row("padding", "n/a", "no mask", "no_mask"), None).status is Status.OK
    any_cause = Expected("padding", (), "any")
    assert judge_row(Row("padding", "fail", "", "left_padding"), any_cause).status is Status.EXPECTED


def test_exit_code_summary_and_assert_healthy_follow_the_baseline():
    r = _result(PADDING_FAIL, CACHE_PASS)
    assert r.exit_code == 1
    r.baseline = Baseline([Expected("padding", ("right_padding",), "known")])
    assert r.exit_code == 0 and r.assert_healthy() is r
    assert "1 as the baseline expects: padding (right_padding)" in r.summary()
    r.baseline = Baseline([Expected("padding", ("left_padding",), "known")])
    assert r.exit_code == 1
    with pytest.raises(AssertionError, match="expects fail \\(left_padding\\)"):
        r.assert_healthy()
    fixed = _result(("padding", "pass"), target="t")
    fixed.baseline = Baseline([Expected("padding", ("right_padding",), "known")])
    assert fixed.exit_code == 0 and "did not happen: padding" in fixed.summary()
    fixed.baseline.strict = True
    assert fixed.exit_code == 1
    with pytest.raises(AssertionError, match="did not happen"):
        fixed.assert_healthy()
    blind = _result(SCALE_BLIND)
    blind.baseline = Baseline([])
    assert blind.exit_code == 3
    blind.baseline = Baseline([Expected("score_scale", ("no_scores",), "fused kernel", "inconclusive")])
    assert blind.exit_code == 0


def test_entries_hold_for_their_targets_and_releases_only():
    e = Expected("padding", ("right_padding",), "r", releases=("torch==2.13.*",), targets=("*eager*",))
    version = {"torch": "2.13.0"}.get
    assert e.holds_for("hf:gpt2 eager", version)
    assert not e.holds_for("hf:gpt2 sdpa", version)
    assert not e.holds_for("hf:gpt2 eager", {"torch": "2.12.1"}.get)
    assert not e.holds_for("hf:gpt2 eager", {}.get)   # not installed: the entry does not hold
    b = Baseline([e])
    r = _result(PADDING_FAIL, target="hf:gpt2 sdpa")
    assert [j.status for j in b.judge(r, version)] == [Status.UNEXPECTED]
    r.target = "hf:gpt2 eager"
    assert [j.status for j in b.judge(r, version)] == [Status.EXPECTED]


def test_a_draft_is_todays_non_passing_rows_and_reads_back(tmp_path):
    r = _result(PADDING_FAIL, CACHE_PASS, ("self_visibility", "warn", "", "positions_from_padding"), SCALE_BLIND)
    d = draft(r)
    assert [(e.check, e.outcome.value, e.cause) for e in d.entries] == [
        ("padding", "fail", ("right_padding",)), ("score_scale", "inconclusive", ("no_scores",))]
    back = Baseline.load(d.save(tmp_path / "b.json"))
    assert back.entries == d.entries
    r.baseline = back
    assert r.exit_code == 0
    again = read_result(r.to_json())   # a result judged against a baseline, read back
    assert again.baseline.entries == d.entries and again.exit_code == 0
    plain = DoctorResult.from_json(r.to_json())   # without the baseline's module: its JSON kept, written again
    assert plain.baseline is None and json.loads(plain.to_json())["baseline"] == json.loads(r.to_json())["baseline"]
    assert json.loads(r.to_json())["baseline"]["judged"] == {
        "padding": "expected", "kv_cache": "ok", "self_visibility": "ok", "score_scale": "expected"}


@pytest.mark.parametrize("text, said", [
    ("{", "not JSON"),
    ('{"expected": [{"check": "padingg", "reason": "x"}]}', "check 'padingg' is not one of the doctor's"),
    ('{"expected": [{"check": "padding"}]}', "padding needs a reason"),
    ('{"expected": [{"check": "padding", "reason": "x", "outcome": "pass"}]}', "outcome 'pass' is not one of"),
    ('{"expected": [{"check": "padding", "reason": "x", "cuase": "y"}]}', "unknown key(s) cuase"),
    ('{"expectd": []}', "unknown key(s) expectd"),
])
def test_a_bad_baseline_is_one_line_naming_what_is_wrong(tmp_path, text, said):
    p = tmp_path / "b.json"
    p.write_text(text)
    with pytest.raises(ValueError) as e:
        Baseline.load(p)
    assert said in str(e.value) and "\n" not in str(e.value) and str(p) in str(e.value)
    with pytest.raises(ValueError, match="cannot be read"):
        Baseline.load(tmp_path / "missing.json")


def test_the_zoos_triage_entries_read_as_baseline_entries_that_judge_its_rows_alike():
    yaml = pytest.importorskip("yaml")   # the triage is YAML (requirements-validation.txt)
    from doctor_lab.report import triage
    entries = triage.load()
    assert yaml is not None and entries
    expected = [x for e in entries for x in from_triage(e)]
    assert {x.id for x in expected} == {e["id"] for e in entries}   # every entry has a baseline form
    qk = next(e for e in entries if e["id"] == "qk_fp16_before_scale")
    b = Baseline(from_triage(qk))
    assert all(x.thread == "huggingface/transformers#33317" and x.outcome.value == "fail" for x in b.entries)
    for cause, arch, impl in (("qk_before_scale", "llama", "eager"), ("target_raised", "llama", "eager"),
                              ("qk_before_scale", "llama", "sdpa")):
        f = {"arch": arch, "impl": impl, "check": "low_precision", "verdict": "fail", "cause": cause,
             "measurements": {}, "release": "5.23.0"}
        by_triage = triage.assign(f, [qk]) is not None
        row = _result(("low_precision", "fail", "", cause), target=f"hf:{arch} {impl}")
        by_baseline = b.judge(row, {"transformers": "5.23.0"}.get)[0].status is Status.EXPECTED
        assert by_triage == by_baseline, (cause, impl)
    xlm = next(e for e in entries if e["id"] == "xlm_generate_passes_its_cache")
    x, w = from_triage(xlm)   # no verdict in the rule: a fail or a warn
    assert (x.outcome.value, w.outcome.value) == ("fail", "warn")
    assert x.releases == ("transformers==5.25.*",) and x.targets == ("hf:xlm *",)
    assert x.holds_for("hf:xlm eager", {"transformers": "5.25.0"}.get)
    assert not x.holds_for("hf:xlm eager", {"transformers": "5.23.0"}.get)


def test_examine_takes_a_baseline_file(tmp_path):
    from attention_doctor import TargetError, examine
    from attention_doctor.project import build_self
    model = build_self(["model.attention.merge=no_transpose"])
    p = Baseline([Expected("future_leak", ("outputs_move",), "planted")]).save(tmp_path / "b.json")
    r = examine(model, checks=["future_leak"], baseline=p)
    assert r["future_leak"].failed and r.exit_code == 0 and r.judged()[0].status is Status.EXPECTED
    bad = tmp_path / "bad.json"
    bad.write_text("[")
    with pytest.raises(TargetError, match="not JSON"):
        examine(model, checks=["future_leak"], baseline=bad)
