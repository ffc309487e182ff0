"""The sentinel (doctor_lab/zoo/sentinel.py): from one zoo table to the next, only what changed,
read through the doctor's schema and grouped by check and cause."""
import json

import pytest

from doctor_lab.zoo import sentinel


def _row(name, outcome, cause="", reason=""):
    return {"name": name, "outcome": outcome, "cause": cause, "reason": reason, "measurements": {}}


def _table(version, results):
    return {"transformers": version, "results": results}


def _arch(arch, *checks, impl="eager", status="examined"):
    return {"arch": arch, "impl": impl, "status": status, "checks": list(checks)}


OLD = _table("5.23.0", [
    _arch("llama", _row("padding", "pass"), _row("kv_cache", "fail", "new_tokens_differ")),
    _arch("mamba", _row("kv_cache", "inconclusive", "unreachable"), _row("score_scale", "pass")),
    _arch("gone", _row("padding", "pass")),
])
NEW = _table("5.25.0", [
    _arch("llama", _row("padding", "pass"), _row("kv_cache", "pass")),
    _arch("mamba", _row("kv_cache", "fail", "new_tokens_differ"), _row("score_scale", "inconclusive", "no_qk_layout")),
    _arch("ergo", _row("low_precision", "fail", "qk_before_scale")),
])


def test_only_what_changed_by_check_and_cause():
    d = sentinel.compare(OLD, NEW, entries=[])
    assert (d.old, d.new) == ("5.23.0", "5.25.0")
    assert [(c.arch, c.check, c.key()) for c in d.new_fails] == [
        ("ergo", "low_precision", ("low_precision", "qk_before_scale")),
        ("mamba", "kv_cache", ("kv_cache", "new_tokens_differ"))]
    assert [(c.arch, c.check) for c in d.new_blind] == [("mamba", "score_scale")]
    assert [(c.arch, c.check, c.key()) for c in d.fixed] == [("llama", "kv_cache", ("kv_cache", "new_tokens_differ"))]
    assert d.archs_new == ["ergo"] and d.archs_gone == ["gone"]
    assert d.problems_new == ["cause:qk_before_scale"] and d.problems_gone == []   # mamba's cause was llama's
    md = sentinel.render(d)
    assert "2 new fail or warn rows, 1 new inconclusive, 1 fixed" in md
    assert "| kv_cache | new_tokens_differ | 1 | mamba (eager: inconclusive -> fail) |" in md
    assert sentinel.compare(OLD, OLD, entries=[]).empty and "Nothing changed." in sentinel.render(
        sentinel.compare(OLD, OLD, entries=[]))


def test_against_a_release_without_a_table_is_one_line(tmp_path):
    root = tmp_path / "zoo"
    (root / "releases" / "5.25.0").mkdir(parents=True)
    (root / "releases" / "5.25.0" / "zoo.json").write_text(json.dumps(NEW))
    (root / "zoo.json").write_text(json.dumps(OLD))
    path, d = sentinel.write(root / "releases" / "5.25.0", root, "5.23.0")
    assert path.name == "against-5.23.0.md" and "mamba (eager: inconclusive -> fail)" in path.read_text()
    with pytest.raises(ValueError, match=r"^--against 4\.0\.0: no zoo table of transformers 4\.0\.0 under .*5\.23\.0, 5\.25\.0"):
        sentinel.write(root / "releases" / "5.25.0", root, "4.0.0")
