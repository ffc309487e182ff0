"""Rewording what the doctor says moves no zoo row: every committed zoo table, triaged as it is and
with every row's detail and reason rewritten, gives the same assignment of rows to problems (triage
reads the schema's fields: outcome, cause, measurements; a rule cannot name a row's words)."""
import copy
import json

import pytest

from conftest import ROOT
from doctor_lab.report import triage
from doctor_lab.report.sections import zoo_diffusers, zoo_xt

SPECS = {"zoo": triage.TRANSFORMERS, "zoo_xt": zoo_xt.TRIAGE, "zoo_diffusers": zoo_diffusers.TRIAGE}
TABLES = sorted((ROOT / "results").glob("zoo*/**/zoo.json"))


def assigned(spec, z: dict) -> list[tuple]:
    entries = spec.entries()
    return [(f["arch"], f["impl"], f["check"], (triage.assign(f, entries) or {}).get("id"))
            for f in spec.table_flags(z)]


def reworded(results: list[dict]) -> list[dict]:
    out = copy.deepcopy(results)
    for r in out:
        for c in r.get("checks", []):
            c["detail"] = "said otherwise: " + (c.get("detail") or "")[::-1]
            if c.get("reason"):
                c["reason"] = "for another reason, worded anew"
            if "outcome" in c and "verdict" in c:   # a display verdict, where the table still carries one
                c["verdict"] = f"{c['outcome']}: reworded"
    return out


def test_the_committed_tables_are_all_here():
    assert {t.relative_to(ROOT / "results").parts[0] for t in TABLES} == set(SPECS), TABLES


@pytest.mark.parametrize("table", TABLES, ids=lambda t: str(t.parent.relative_to(ROOT / "results")))
def test_rewording_a_detail_moves_no_row(table):
    spec = SPECS[table.relative_to(ROOT / "results").parts[0]]
    z = json.loads(table.read_text())
    before = assigned(spec, z)
    assert before, f"{table}: no flagged row to triage"
    assert assigned(spec, {**z, "results": reworded(z["results"])}) == before


def test_a_rule_cannot_name_a_rows_words(tmp_path):
    bad = tmp_path / "triage.yaml"
    bad.write_text('- {id: a, kind: known, thread: x, check: padding, detail: "right padding 0.3"}\n')
    with pytest.raises(ValueError, match="unknown keys detail"):
        triage.load(bad)
    bad.write_text('- {id: a, kind: known, thread: x, match: [{check: padding, detail: "right padding 0.3"}]}\n')
    with pytest.raises(ValueError, match="a rule has a check and only"):
        triage.load(bad)


def test_a_rule_for_some_releases_matches_their_tables_rows_only(tmp_path):
    rules = tmp_path / "triage.yaml"
    rules.write_text('- {id: old, kind: known, thread: x, check: padding, releases: ["4.*"]}\n'
                     '- {id: any, kind: known, thread: y, check: padding}\n')
    entries = triage.load(rules)
    row = {"arch": "a", "impl": "eager", "status": "examined",
           "checks": [{"name": "padding", "outcome": "fail", "cause": "right_padding"}]}
    for release, want in (("4.46.3", "old"), ("5.0.0", "any"), ("unknown", "any")):
        (f,) = triage.TRANSFORMERS.table_flags({"transformers": release, "results": [row]})
        assert f["release"] == release and triage.assign(f, entries)["id"] == want
