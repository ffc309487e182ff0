"""The backtest's record (doctor_lab/backtest/record.yaml): its schema, its repros standalone, and one
repro run on the installed transformers where the record measured that release."""
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from doctor_lab.backtest import record as rec
from doctor_lab.backtest import releases

ENTRIES = rec.load()


def test_the_record_holds_its_entries_with_every_field():
    assert len(ENTRIES) >= 9
    assert len({e.id for e in ENTRIES}) == len(ENTRIES)
    for e in ENTRIES:
        assert e.title and e.threads and e.architectures and e.implementations and e.condition, e.id
        assert e.repro is not None or e.no_repro, e.id


def test_releases_are_on_the_index_and_in_order():
    for e in ENTRIES:
        order = {v: i for i, v in enumerate(releases.known(e.library))}
        assert order[e.before] + 1 == order[e.introduced], f"{e.id}: before is the release just before introduced"
        if e.fixed != rec.OPEN:
            assert order[e.introduced] < order[e.fixed], e.id


def test_each_repro_was_verified_on_its_three_releases():
    for e in ENTRIES:
        if e.repro is None:
            continue
        assert e.verified == {r: e.expected(r) for r in e.releases}, f"{e.id}: verified {e.verified}"


def test_each_repro_imports_torch_its_library_and_the_stdlib_only():
    for e in ENTRIES:
        if e.repro is not None:
            assert rec._imports(e.repro) <= rec.IMPORTS[e.library], e.id
            assert e.repro.name == f"{e.id}.py"


def test_checks_name_the_doctor_registry_or_a_missing_probe():
    checks = rec.registered_checks()
    for e in ENTRIES:
        assert e.check in checks or e.check in rec.PROBES, e.id


def _one_entry(tmp_path: Path, **change) -> Path:
    raw = yaml.safe_load(rec.RECORD.read_text())
    entry = next(r for r in raw if r["repro"])
    entry.update(change)
    p = tmp_path / "record.yaml"
    p.write_text(yaml.safe_dump([entry]))
    return p


@pytest.mark.parametrize("change, says", [
    ({"before": "4.99.0"}, "is not a transformers release"),
    ({"fixed": "4.36.0"}, "is not newer than introduced"),
    ({"check": "padding_typo"}, "neither a doctor check"),
    ({"condition": ["left_padding", "moon_phase"]}, "moon_phase"),
    ({"repro": None}, "no repro and no reason"),
    ({"threads": ["#123"]}, "owner/repo #N"),
    ({"config": {"sliding_window": [16, 32]}}, "config maps config keys to plain values"),
])
def test_a_broken_entry_is_refused_with_what_is_wrong(tmp_path, change, says):
    with pytest.raises(rec.RecordError, match=says):
        rec.load(_one_entry(tmp_path, **change))


def test_a_repro_that_imports_another_library_is_refused(tmp_path, monkeypatch):
    entry = next(e for e in ENTRIES if e.repro)
    fake = tmp_path / "repros"
    fake.mkdir()
    (fake / entry.repro.name).write_text(entry.repro.read_text() + "\nimport numpy\n")
    monkeypatch.setattr(rec, "HERE", tmp_path)
    monkeypatch.setattr(rec, "REPROS", fake)
    with pytest.raises(rec.RecordError, match="numpy"):
        rec.load(_one_entry(tmp_path))


def test_one_repro_on_the_installed_release():
    """The first entry whose repro the record measured on the installed transformers (one of its
    releases, or a release tried while bisecting) exits as recorded."""
    pytest.importorskip("transformers", reason="needs transformers (requirements-validation.txt)")
    installed = importlib.metadata.version("transformers")
    for e in ENTRIES:
        measured = {**e.history, **e.verified}
        if e.repro is not None and installed in measured:
            break
    else:
        pytest.skip(f"no repro was measured on transformers {installed}: "
                    f"python -m doctor_lab.backtest.verify runs them on their own releases")
    r = subprocess.run([sys.executable, str(e.repro)], capture_output=True, text=True, timeout=300)
    assert r.returncode == measured[installed], f"{e.id} on {installed}: {r.stdout}{r.stderr}"


def _other_library_entry(tmp_path: Path, monkeypatch, repro_text: str, **change) -> Path:
    """One entry of another library (x-transformers), its repro in tmp_path/repros."""
    entry = next(e for e in ENTRIES if e.library == "x-transformers")
    fake = tmp_path / "repros"
    fake.mkdir(parents=True)
    (fake / entry.repro.name).write_text(repro_text)
    monkeypatch.setattr(rec, "HERE", tmp_path)
    monkeypatch.setattr(rec, "REPROS", fake)
    raw = next(r for r in yaml.safe_load(rec.RECORD.read_text()) if r["id"] == entry.id)
    raw.update(change)
    p = tmp_path / "record.yaml"
    p.write_text(yaml.safe_dump([raw]))
    return p


def test_an_entry_of_another_library_reads_its_own_index_and_imports(tmp_path, monkeypatch):
    entry = next(e for e in ENTRIES if e.library == "x-transformers")
    ok = _other_library_entry(tmp_path, monkeypatch, entry.repro.read_text())
    assert rec.load(ok)[0].library == "x-transformers"
    with pytest.raises(rec.RecordError, match="is not a x-transformers release"):
        rec.load(_other_library_entry(tmp_path / "a", monkeypatch, entry.repro.read_text(), fixed="4.50.0"))
    with pytest.raises(rec.RecordError, match=r"imports \['transformers'\]"):
        rec.load(_other_library_entry(tmp_path / "b", monkeypatch, entry.repro.read_text() + "\nimport transformers\n"))
    with pytest.raises(rec.RecordError, match="library 'jax'"):
        rec.load(_other_library_entry(tmp_path / "c", monkeypatch, entry.repro.read_text(), library="jax"))


def test_verify_refuses_an_unknown_entry_in_one_line(capsys):
    from doctor_lab.backtest import verify
    assert verify.main(["no_such_regression"]) == 2
    assert "no entry no_such_regression" in capsys.readouterr().err


def test_every_repro_in_the_folder_belongs_to_an_entry():
    owned = {e.repro.name for e in ENTRIES if e.repro is not None}
    assert {p.name for p in rec.REPROS.glob("*.py")} == owned
