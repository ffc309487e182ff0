"""The doctor's output for people and for CI: the table at most 100 columns whatever the registry's
names and causes, markdown for a pull request, one GitHub annotation per check that stops the gate,
`--write-baseline` then `--baseline` (the draft makes the same run exit 0), and `--against OLD NEW`
(what changed, by the same classification as the zoo's sentinel)."""
import json
import re

import pytest

from attention_doctor.baseline import Baseline, Expected
from attention_doctor.checks import COMMON_CAUSES, REGISTRY
from attention_doctor.cli import main
from attention_doctor.compare import between, classify
from attention_doctor.formats import github, markdown
from attention_doctor.result import WIDTH, DoctorResult, Row

BUGGY = "self:model.attention.merge=no_transpose"


def _worst() -> DoctorResult:
    """Every check with its longest cause, the widest outcome and a wide number: the widest table."""
    rows = []
    for rec in REGISTRY:
        cause = max([*rec.causes, *COMMON_CAUSES], key=len)
        rows.append(Row(rec.name, "inconclusive", "why " * 40, cause, -1.2345e-07, "<= 1e-05; " * 9,
                        experiment=rec.experiment, thread=rec.thread))
    r = DoctorResult("a/very/long/path/to/a/target/file.py:factory_with_a_long_name " * 3, rows)
    r.baseline = Baseline([Expected(rows[0].name, ("x",), "because " * 30, thread="owner/repo#1")])
    return r


def test_the_widest_table_the_registry_allows_fits_100_columns():
    t = _worst().table()
    assert max(len(line) for line in t.splitlines()) <= WIDTH == 100, t
    assert "[15]" in t and "the baseline expects fail (x): because" in re.sub(r"\s+", " ", t)


def test_markdown_and_github_formats():
    r = DoctorResult("m", [Row("future_leak", "fail", "", "outputs_move", 0.1, "<= 1e-06", detail="moved: 50%"),
                           Row("padding", "warn", "", "positions_from_padding"), Row("kv_cache", "pass"),
                           Row("score_scale", "inconclusive", "no scores", "no_scores"),
                           Row("fully_masked_rows", "fail", "", "nonfinite_gradients")])
    md = markdown(r)
    assert "| `future_leak` | **fail** | `outputs_move` | 0.1 | <= 1e-06 |" in md
    assert "| check | outcome | cause | measured | tolerance | note |" in md and "1. " in md
    gh = github(r).splitlines()
    errors = [ln for ln in gh if ln.startswith("::error ")]
    assert [re.search(r"title=attention doctor%3A (\w+)::", ln).group(1) for ln in errors] == [
        "future_leak", "score_scale", "fully_masked_rows"]
    assert "moved: 50%25" in errors[0]   # GitHub's escaping
    assert sum(ln.startswith("::warning ") for ln in gh) == 1 and gh[len(errors) + 1].startswith("attention doctor: m")
    r.baseline = Baseline([Expected("fully_masked_rows", ("nonfinite_gradients",), "known"),
                           Expected("kv_cache", ("prefill_differs",), "was broken")])
    gh = github(r)
    assert "title=attention doctor%3A fully_masked_rows" not in gh   # expected: no error
    assert "::warning title=attention doctor%3A kv_cache::kv_cache: pass; the baseline expects" in gh


def test_write_baseline_then_baseline_makes_the_same_run_pass(tmp_path, capsys):
    b = tmp_path / "b.json"
    assert main([BUGGY, "--checks", "future_leak,kv_cache", "--write-baseline", str(b)]) == 1
    capsys.readouterr()
    entries = json.loads(b.read_text())["expected"]
    assert [(e["check"], e["cause"]) for e in entries] == [("future_leak", "outputs_move"),
                                                           ("kv_cache", "prefill_differs")]
    assert main([BUGGY, "--checks", "future_leak,kv_cache", "--baseline", str(b), "--format", "github"]) == 0
    out = capsys.readouterr().out
    assert "::error" not in out and "2 as the baseline expects" in out
    assert main(["self:", "--checks", "future_leak", "--baseline", str(b)]) == 0   # fixed: reported
    assert "did not happen: future_leak" in capsys.readouterr().out
    assert main(["self:", "--checks", "future_leak", "--baseline", str(b), "--baseline-strict"]) == 1
    bad = tmp_path / "bad.json"
    bad.write_text('{"expected": [{"check": "nope", "reason": ""}]}')
    assert main([BUGGY, "--baseline", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "check 'nope' is not one of the doctor's" in err


def test_against_prints_what_changed_and_exits_on_a_regression(tmp_path, capsys):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    rows = lambda *o: [Row("future_leak", o[0], "", o[1]), Row("padding", o[2], "", o[3]), Row("kv_cache", "pass")]
    DoctorResult("v1", rows("pass", "", "fail", "right_padding")).to_json(old)
    DoctorResult("v2", rows("fail", "outputs_move", "pass", "")).to_json(new)
    assert main(["--against", str(old), str(new)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "attention doctor: v2 against v1: 1 new fail or warn, 1 fixed"
    assert re.match(r"future_leak +pass -> fail \(outputs_move\) +\(new fail or warn\)", out[1]), out
    assert re.match(r"padding +fail \(right_padding\) -> pass +\(fixed\)", out[2]), out
    assert main(["--against", str(old), str(old)]) == 0
    assert "nothing changed (3 checks)" in capsys.readouterr().out
    DoctorResult("v3", rows("pass", "", "pass", "")).to_json(new)
    assert main(["--against", str(old), str(new)]) == 0   # only a fix
    capsys.readouterr()
    DoctorResult("v3", rows("pass", "", "fail", "left_padding")).to_json(new)
    assert main(["--against", str(old), str(new)]) == 1 and "cause changed" in capsys.readouterr().out
    assert main(["--against", str(old), str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("old, new, kind", [
    (None, ("fail", "x"), "new_fail"), (("pass", ""), ("warn", "y"), "new_fail"),
    (("n/a", ""), ("inconclusive", "z"), "new_blind"), (("fail", "x"), ("n/a", ""), "fixed"),
    (("fail", "x"), ("fail", "y"), "cause_changed"), (("fail", "x"), ("fail", "x"), None),
    (("pass", ""), None, "gone"), (("inconclusive", "z"), ("inconclusive", "z"), None)])
def test_one_classification_of_a_rows_move(old, new, kind):
    row = lambda o: None if o is None else Row("padding", o[0], "", o[1])
    assert classify(row(old), row(new)) == kind
    a, b = (DoctorResult("t", [row(x)] if x else []) for x in (old, new))
    assert [m.kind for m in between(a, b)] == ([kind] if kind else [])
