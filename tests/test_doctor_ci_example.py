"""docs/doctor.md's worked example of the doctor in CI is rendered, not typed: its file blocks are
the example project's files (python -m doctor_lab.ci_example --check), and its output blocks hold
what a clean run and a regression print (the plugin's own behaviour is tests/test_doctor_pytest_plugin.py's)."""
import re

from doctor_lab import ci_example


def test_the_page_shows_the_example_files_as_they_are():
    assert ci_example.stale(ci_example.DOC) == []
    assert ci_example.main(["--check"]) == 0


def test_the_rendered_runs_say_what_ci_says(tmp_path):
    blocks = {m.group(2): m.group(0) for m in ci_example.BLOCK.finditer(ci_example.DOC.read_text())}
    assert set(blocks) == {"model", "test", "baseline", "clean", "regression", "against"}
    assert re.search(r"test_model\[fully_masked_rows\] XFAIL", blocks["clean"]) and "1 xfailed" in blocks["clean"]
    assert "FAILED" not in blocks["clean"] and "$ echo $?\n0\n" in blocks["clean"]
    assert "$ echo $?\n1\n" in blocks["regression"]
    assert "FAILED tests/test_attention.py::test_model[future_leak] - Failed: future_leak: fail (outputs_move)" \
        in blocks["regression"]
    assert "future_leak  pass -> fail (outputs_move)  (new fail or warn)" in blocks["against"]
    doc = tmp_path / "doc.md"
    doc.write_text("a\n<!-- BEGIN ci_example:test -->\nold\n<!-- END ci_example:test -->\n<!-- BEGIN ci_example:x -->\n"
                   "<!-- END ci_example:x -->\n")
    assert ci_example.stale(doc) == ["model", "test", "baseline"]
    assert ci_example.write(doc, ci_example.files()) == ["x"]
    assert "old" not in doc.read_text() and ci_example.stale(doc) == ["model", "baseline"]
