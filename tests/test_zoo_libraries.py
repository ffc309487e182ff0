"""The library zoos (doctor_lab.zoo_xt, doctor_lab.zoo_diffusers) on a few targets: statuses and
reasons in the table, a resume that redoes nothing, the cost recorded, bad input; the x-transformers
options table against the installed signatures; the table across releases. Each part skips, saying
why, where its library is not installed."""
import csv
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def zoo(module, *args, out):
    return subprocess.run([sys.executable, "-m", module, *args, "--out", str(out)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=600)


def rows(out):
    return list(csv.DictReader(open(out / "zoo.csv")))


@pytest.fixture(scope="module")
def xt():
    return pytest.importorskip("x_transformers", reason="x-transformers is not installed (requirements-validation.txt)")


def test_xt_zoo_statuses_resume_and_cost(xt, tmp_path):
    targets = ["rotary_pos_emb", "attn_pre_talking_heads", "attn_custom_attn_fn"]
    p = zoo("doctor_lab.zoo_xt", "--target", *targets, "--checks", "kv_cache,path_agreement", out=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    got = {(r["target"], r["path"], r["check"]): r for r in rows(tmp_path)}
    for path in ("flash", "einsum"):
        assert got[("rotary_pos_emb", path, "kv_cache")]["verdict"] == "pass"
        assert got[("rotary_pos_emb", path, "path_agreement")]["verdict"] == "pass"   # flash against einsum
        assert got[("attn_custom_attn_fn", path, "")]["status"] == "skipped"
    assert got[("attn_pre_talking_heads", "flash", "")]["status"] == "unsupported"
    assert "talking heads not compatible with flash" in got[("attn_pre_talking_heads", "flash", "")]["detail"]
    assert got[("attn_pre_talking_heads", "einsum", "path_agreement")]["verdict"].startswith("n/a: ")   # one path only
    z = json.loads((tmp_path / "zoo.json").read_text())
    assert z["library"] == "x-transformers" and z["examined"] == 2 and z["targets"] > 100   # the table's every target
    assert "attn_qk_norm" in z["not_run"] and "attn_custom_attn_fn" not in z["not_run"]
    assert z["cost"]["invocations"] == 1 and z["cost"]["wall_s"] > 0 and z["cost"]["cpu_s"] > 0
    before = {f: f.stat().st_mtime_ns for f in (tmp_path / "runs").glob("*.json")}
    p = zoo("doctor_lab.zoo_xt", "--target", *targets, "--checks", "kv_cache,path_agreement", out=tmp_path)
    assert p.returncode == 0 and "to run" not in p.stdout, p.stdout
    assert {f: f.stat().st_mtime_ns for f in (tmp_path / "runs").glob("*.json")} == before


def test_xt_options_table_covers_every_option_of_the_installed_release(xt):
    import inspect

    from x_transformers.x_transformers import Attention, AttentionLayers

    from doctor_lab.zoo_xt import load_table
    t = load_table()
    named = set(t["not_examined"]) | {k for opts in t["targets"].values() for k in opts}
    attn = {f"attn_{n}" for n in inspect.signature(Attention.__init__).parameters} - {"attn_self", "attn_dim"}
    layers = set(inspect.signature(AttentionLayers.__init__).parameters) - {"self", "kwargs", "dim", "depth", "heads", "causal"}
    assert attn | layers <= named, sorted((attn | layers) - named)
    assert all(t["notes"][n] for n in t["targets"] if "+" in n)   # every pair says what code it shares


def test_releases_table_first_with_and_first_fixed(tmp_path):
    """Per problem of the xt triage: the first release that has it and the first later one without it;
    an option a release does not know yet is absent there (not a build error, not a row)."""
    from doctor_lab.report.releases import load_tables, over_releases
    from doctor_lab.report.sections.zoo_xt import TRIAGE
    from doctor_lab.zoo_xt.releases import write_across

    def z(v, verdict, status="examined", reason=""):
        r = [{"arch": "shift_tokens", "impl": "flash", "status": status, "reason": reason,
              "checks": [{"name": "kv_cache", "verdict": verdict}, {"name": "padding", "verdict": "pass"}]},
             {"arch": "orthog_residual", "impl": "flash", "status": "build_error" if v == "1.44.8" else "examined",
              "reason": "AssertionError: unrecognized kwargs passed in dict_keys(['orthog_residual'])",
              "checks": [{"name": "future_leak", "verdict": "fail"}]}]
        (tmp_path / v).mkdir()
        (tmp_path / v / "zoo.json").write_text(json.dumps({"version": v, "targets": 2, "examined": 1, "results": r}))
    z("1.44.8", "pass")
    z("2.11.24", "fail")
    z("2.3.27", "fail")
    z("2.31.10", "pass")
    assert "2 problems over 1.44.8, 2.3.27, 2.11.24, 2.31.10 (1 fixed" in write_across(tmp_path)
    rows = {r["problem"]: r for r in csv.DictReader(open(tmp_path / "releases.csv"))}
    cache = rows["xt_cache_without_its_state"]   # by version, not by name
    assert (cache["first_seen"], cache["fixed_in"]) == ("2.3.27", "2.31.10")
    assert [cache[f"rows {v}"] for v in ("1.44.8", "2.3.27", "2.11.24", "2.31.10")] == ["0", "1", "1", "0"]
    orthog = rows["xt_orthog_project_whole_sequence"]
    assert (orthog["first_seen"], orthog["fixed_in"], orthog["rows 1.44.8"]) == ("2.3.27", "open", "")
    cells = over_releases(load_tables(tmp_path), spec=TRIAGE)["cells"]
    assert cells["orthog_residual"] == {"1.44.8": "absent", "2.3.27": "finding", "2.11.24": "finding", "2.31.10": "finding"}


def test_diffusers_zoo_statuses(tmp_path):
    pytest.importorskip("diffusers", reason="diffusers is not installed (requirements-validation.txt)")
    p = zoo("doctor_lab.zoo_diffusers", "--target", "AttnProcessor2_0", "XFormersAttnProcessor",
            "IPAdapterAttnProcessor2_0", "--checks", "padding,path_agreement", out=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    got = {(r["target"], r["path"], r["check"]): r for r in rows(tmp_path)}
    for path in ("self", "cross"):
        assert got[("AttnProcessor2_0", path, "padding")]["verdict"] == "pass"
        assert got[("AttnProcessor2_0", path, "path_agreement")]["verdict"] == "pass"
        assert got[("XFormersAttnProcessor", path, "")]["status"] == "skipped"
        assert "needs xformers" in got[("XFormersAttnProcessor", path, "")]["detail"]
    assert got[("IPAdapterAttnProcessor2_0", "self", "")]["status"] == "unsupported"
    assert got[("IPAdapterAttnProcessor2_0", "cross", "padding")]["verdict"] == "pass"


@pytest.mark.parametrize("module,args,says", [
    ("doctor_lab.zoo_xt", ["--target", "no_such_option"], "not in the zoo's table: no_such_option"),
    ("doctor_lab.zoo_xt", ["--path", "sdpa"], "--path 'sdpa': give some of flash,einsum"),
    ("doctor_lab.zoo_diffusers", ["--checks", "nope"], "unknown check(s) nope")])
def test_bad_input_is_one_line_and_exit_2(module, args, says, tmp_path):
    pytest.importorskip("x_transformers" if module.endswith("xt") else "diffusers")
    p = zoo(module, *args, out=tmp_path)
    assert p.returncode == 2 and says in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
