"""The public reference implementations' harness (doctor_lab/references.py) without their
code: what is missing is said, never passed; a notebook-as-script yields its model definitions
alone; the report renders the rows and flags anything unexplained."""
import json

from doctor_lab.references import ANNOTATED, REFERENCES, annotated_source
from doctor_lab.report.sections.doctor import references as render
from doctor_lab.validation import references


def test_missing_clones_and_releases_are_said(tmp_path):
    references(tmp_path, tmp_path / "pinned", {})
    rows = json.loads((tmp_path / "references.json").read_text())["rows"]
    assert [r["name"] for r in rows] == [r["name"] for r in REFERENCES]
    assert all(r["error"].startswith("not installed: ") and "result" not in r for r in rows)
    nano = next(r for r in rows if r["name"] == "nanoGPT")
    assert "--source nanoGPT=PATH (git clone https://github.com/karpathy/nanoGPT)" in nano["error"]
    assert "error: not installed" in render(json.loads((tmp_path / "references.json").read_text()))


def test_a_notebook_script_gives_its_definitions_only(tmp_path):
    (tmp_path / "the_annotated_transformer.py").write_text(
        "import altair  # the plotting the model does not need\n"
        "def subsequent_mask(size):\n    return torch.ones(1, size, size).tril() == 1\n\n"
        "print(undefined_name)  # training code at the top level\n"
        "def show_example(fn):\n    raise AssertionError('not a model definition')\n")
    ns = annotated_source(tmp_path)
    assert "subsequent_mask" in ANNOTATED and "show_example" not in ns
    assert ns["subsequent_mask"](3).sum() == 6
    assert ns["subsequent_mask"].__code__.co_filename.endswith("the_annotated_transformer.py")


def _row(verdicts, by_nature=None, findings=None):
    checks = [{"name": n, "verdict": v} for n, v in verdicts.items()]
    return {"name": "X", "provenance": {"release": "x==1"}, "by_nature": by_nature or {}, "findings": findings or {},
            "result": {"checks": checks, "info": {"checks_run": sum(v in ("pass", "fail", "warn") for v in verdicts.values())}}}


def test_the_report_flags_what_is_not_explained():
    text = render({"rows": [_row({"padding": "fail", "kv_cache": "n/a: needs a KV cache",
                                  "score_scale": "inconclusive: no verified q/k layout"}, {"score_scale": "by nature?"})]})
    assert "X: padding; X: kv_cache did not run; X: score_scale inconclusive" in text and "1 of 3" in text
    ok = render({"rows": [_row({"padding": "fail", "kv_cache": "n/a: needs a KV cache"}, {"kv_cache": "no cache"},
                               {"padding": "positions from the first column"})]})
    assert "Unexplained: none." in ok and "**X, padding**: positions from the first column" in ok


def test_the_committed_evidence_has_every_reference_and_style_explained():
    from conftest import ROOT
    src = ROOT / "results" / "doctor"
    if not (src / "references.json").exists() or not (src / "styles.json").exists():
        import pytest
        pytest.skip("no committed evidence for the styles and references")
    refs = json.loads((src / "references.json").read_text())
    assert [r["name"] for r in refs["rows"]] == [r["name"] for r in REFERENCES]
    for r in refs["rows"]:   # built from a recorded commit or release, examined, nothing refused
        assert "error" not in r, r["error"]
        assert r["provenance"].get("release") or len(r["provenance"]["commit"]) == 40
    assert "Unexplained: none." in render(refs)
    from doctor_lab.report.sections.doctor import styles
    assert "missed: none" in styles(json.loads((src / "styles.json").read_text()))
