"""The library zoos in the report (doctor_lab/report/library_zoo.py; sections zoo_xt and
zoo_diffusers): synthetic tables in tmp_path, no library needed. Counts of problems and rows, an
untriaged row said loudly, the triage rules checked against what a row shows, DOCTOR.md and the
README's lab blocks from the committed tables (`python -m doctor_lab.report`)."""
import json

import pytest

from conftest import ROOT, pad

OVERFLOW_PLAIN = {"nonfinite_runs": [{"dtype": "float16", "mode": "weights", "batch": "plain", "scores": 30000.0,
                                      "nonfinite": 1024}]}


def _check(name, verdict, detail="", tolerance="<= 1e-05", m=None):
    return {"name": name, "verdict": verdict, "detail": detail, "tolerance": tolerance, "measured": None,
            "measurements": m or {}}


def _table(results, version, **extra):
    examined = {r["arch"] for r in results if r["status"] == "examined"}
    return {"library": "x", "version": version, "torch": "2.13.0+cpu", "targets": len({r["arch"] for r in results}),
            "examined": len(examined), "impls": sorted({r["impl"] for r in results}), "not_examined": {},
            "not_run": [], "results": results, "cost": {"wall_s": 600.0, "cpu_s": 900.0}, **extra}


def _write(root, version, results, **extra):
    (root / version).mkdir(parents=True)
    (root / version / "zoo.json").write_text(json.dumps(_table(results, version, **extra)))


XT_ROWS = [
    {"arch": "alibi_pos_bias", "impl": "flash", "status": "examined",
     "checks": [_check("padding", "warn", m=pad(2e-07, 0.67, 2e-07)),
                _check("score_scale", "pass")]},
    {"arch": "alibi_pos_bias", "impl": "einsum", "status": "examined",
     "checks": [_check("padding", "warn", m=pad(0, 0.67, 0)),
                _check("low_precision", "fail", m=OVERFLOW_PLAIN)]},
    {"arch": "shift_tokens", "impl": "flash", "status": "examined",
     "checks": [_check("kv_cache", "fail", "cached against the full forward: new tokens 0.735")]},
    {"arch": "attn_gumbel_softmax", "impl": "einsum", "status": "examined",
     "checks": [_check("score_scale", "inconclusive: needs dot-product scores of a known q/k site's calls (none seen)"),
                _check("long_positions", "n/a: needs positions")]},
    {"arch": "add_value_residual+attn_kv_heads", "impl": "einsum", "status": "forward_error",
     "reason": "RuntimeError: The size of tensor a (2) must match the size of tensor b (4)"},
    {"arch": "newopt", "impl": "einsum", "status": "examined", "checks": [_check("future_leak", "fail", "t=1: 0.02")]},
    {"arch": "attn_causal", "impl": "einsum", "status": "skipped", "reason": "the Decoder sets it"},
]


def test_xt_section_counts_problems_and_rows_and_says_untriaged(tmp_path):
    from doctor_lab.report.sections import zoo_xt
    _write(tmp_path / "zoo_xt", "2.31.10", XT_ROWS,
           not_examined={"attn_causal": ["einsum: skipped: the Decoder sets it"]})
    blocks = zoo_xt.blocks([], tmp_path / "figures")
    md, line = blocks["zoo_xt"], blocks["zoo_xt_summary"]
    # 7 rows: two left-padding warns (one known problem), one fp16 fail (known), one kv_cache fail and one
    # forward_error (two findings), one inconclusive (a doctor false alarm), one untriaged fail
    assert "7 rows (5 fail or warn, 1 inconclusive, 1 raised before the doctor), **6 problems**" in md
    assert "2 new findings (2 rows), 1 doctor false alarm (1 row), 2 known behaviours (3 rows), 1 untriaged (1 row)" in md
    assert "| xt_absolute_positions_left_padding | known behaviour: " in md and "| 2 | alibi_pos_bias (einsum+flash) |" in md
    assert "[lucidrains/x-transformers#84](https://github.com/lucidrains/x-transformers/issues/84)" in md
    assert "| xt_value_residual_grouped_kv | new finding: " in md and "xt_value_residual_grouped_kv.md" in md
    assert "| untriaged:newopt:future_leak | **untriaged** (future_leak) | 1 | newopt (einsum) |" in md
    assert "- **attn_causal**: einsum: skipped: the Decoder sets it" in md
    assert "10.0 min wall, 15.0 min CPU" in md
    assert line.startswith("x-transformers 2.31.10: **4 of 6** targets examined (einsum 3, flash 2); 7 rows")
    assert "**6 problems**" in line and "1 untriaged (1 row)" in line and "10.0 min wall, 15.0 min CPU" in line
    assert "Across releases" not in md   # one release: no table over releases


def test_xt_section_over_releases_with_its_picture(tmp_path):
    from doctor_lab.report.sections import zoo_xt
    old = [dict(r) for r in XT_ROWS if r["arch"] != "shift_tokens"] + [
        {"arch": "shift_tokens", "impl": "flash", "status": "examined", "checks": [_check("kv_cache", "pass")]},
        {"arch": "polar_pos_emb", "impl": "flash", "status": "build_error",
         "reason": "AssertionError: unrecognized kwargs passed in dict_keys(['rotary_pos_emb_type'])"}]
    _write(tmp_path / "zoo_xt", "1.44.8", old)
    _write(tmp_path / "zoo_xt", "2.31.10", XT_ROWS)
    blocks = zoo_xt.blocks([], tmp_path / "figures")
    md = blocks["zoo_xt"]
    assert "### x-transformers across releases" in md and "`results/zoo_xt/releases.csv`" in md
    assert "| xt_cache_without_its_state | new finding | 2.31.10 | open | 0 | 1 |" in md
    assert "| xt_value_residual_grouped_kv | new finding | 1.44.8 | open | 1 | 1 |" in md
    assert "| 1.44.8 |  | 7 | 4 | 10.0 min | 15.0 min |" in md   # each release's cost
    assert "Over 2 releases (1.44.8, 2.31.10): 6 problems, 0 fixed" in blocks["zoo_xt_summary"]
    png = tmp_path / "figures" / "zoo_xt_releases.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_diffusers_section_counts(tmp_path):
    from doctor_lab.report.sections import zoo_diffusers
    rows = [
        {"arch": "JointAttnProcessor2_0", "impl": "cross", "status": "examined",
         "checks": [_check("padding", "fail", m=pad(0.323, 0.272))]},
        {"arch": "AttnProcessor2_0", "impl": "cross", "status": "examined",
         "checks": [_check("padding", "pass"), _check("self_visibility", "inconclusive: needs the attention weights")]},
        {"arch": "FluxAttnProcessor2_0", "impl": "self", "status": "doctor_error",
         "reason": "TargetRaised: IndexError: tuple index out of range"},
    ]
    _write(tmp_path / "zoo_diffusers", "0.42.1", rows)
    blocks = zoo_diffusers.blocks([], tmp_path / "figures")
    md = blocks["zoo_diffusers"]
    assert "3 rows (1 fail or warn, 1 inconclusive, 1 raised before the doctor), **3 problems**" in md
    assert "[huggingface/diffusers#8673](https://github.com/huggingface/diffusers/issues/8673)" in md
    assert "| cross_attention_self_visibility | doctor false alarm: " in md and "| flux_sdpa_by_keyword |" in md
    assert blocks["zoo_diffusers_summary"].startswith("diffusers 0.42.1: **2 of 3** processors examined")
    assert "untriaged" not in blocks["zoo_diffusers_summary"]


def test_library_triage_rules_check_the_row():
    from doctor_lab.report import triage
    from doctor_lab.report.sections import zoo_diffusers, zoo_xt
    xt = zoo_xt.TRIAGE.entries()
    row = lambda arch, check, verdict, m, impl="einsum": {  # noqa: E731
        "arch": arch, "impl": impl, "check": check, "verdict": verdict, "detail": "", "tolerance": "", "cause": "",
        "measurements": m}
    assert triage.assign(row("use_rmsnorm", "padding", "warn", pad(0, 0.7, 0)), xt)["id"] == "xt_absolute_positions_left_padding"
    # a right padding that moves the outputs is not explained by the positions of left padding
    assert triage.assign(row("use_rmsnorm", "padding", "warn", pad(0.1, 0.7)), xt) is None
    # the fp16 overflow is the einsum path's; the same fail on the flash path is not this reason
    assert triage.assign(row("use_rmsnorm", "low_precision", "fail", OVERFLOW_PLAIN), xt)["id"] == "xt_einsum_qk_fp16_before_scale"
    assert triage.assign(row("use_rmsnorm", "low_precision", "fail", OVERFLOW_PLAIN, impl="flash"), xt) is None
    # a build error for another reason than the finding's is not the finding
    leaf = {"error": "RuntimeError: a leaf Variable that requires grad is being used in an in-place operation."}
    assert triage.assign(row("polar_bias_uniform_init", "build_error", "error", leaf), xt)["kind"] == "finding"
    assert triage.assign(row("polar_bias_uniform_init", "build_error", "error", {"error": "CUDA out of memory"}), xt) is None
    # `!pattern` leaves architectures out: dynamic_pos_bias's float32 positions come first for its rows
    raised = {"nonfinite_runs": [{"batch": "left_padded", "raised": "RuntimeError: mat1 and mat2 must have the same dtype, "
                                                                    "but got Float and Half"}]}
    einx = {**row("use_rmsnorm", "low_precision", "fail", raised, impl="flash"), "cause": "raised_in_low_precision"}
    assert triage.assign(einx, xt)["id"] == "xt_masked_output_float32"
    assert triage.assign({**einx, "arch": "dynamic_pos_bias"}, xt)["id"] == "xt_dynamic_pos_bias_float32_positions"
    # a release without the option: its build error is not a row at all
    absent = {"arch": "polar_pos_emb", "impl": "flash", "status": "build_error",
              "reason": "AssertionError: unrecognized kwargs passed in dict_keys(['polar_pos_emb'])"}
    other = {**absent, "reason": "RuntimeError: boom"}
    assert zoo_xt.TRIAGE.flags([absent]) == [] and [f["check"] for f in zoo_xt.TRIAGE.flags([other])] == ["build_error"]
    # the transformers zoo's triage still flags only its fail and warn rows
    inc = {"arch": "a", "impl": "eager", "status": "examined", "checks": [_check("score_scale", "inconclusive: x")]}
    assert triage.TRANSFORMERS.flags([inc, other]) == [] and len(zoo_xt.TRIAGE.flags([inc, other])) == 2
    for spec in (zoo_xt.TRIAGE, zoo_diffusers.TRIAGE):   # each finding's page, repro and patch exist
        for e in spec.entries():
            if e["kind"] == "finding":
                page = ROOT / e["finding"]
                assert page.is_file() and page.with_suffix(".py").is_file() and page.with_suffix(".patch").is_file(), e["id"]


def test_the_lab_report_places_each_zoo_and_refreshes_in_place(tmp_path):
    """DOCTOR.md with the x-transformers and diffusers zoos in the lab's order, the README's
    lab:zoo_xt_summary filled; a second run gives the same bytes."""
    from doctor_lab.report.build import main
    _write(tmp_path / "zoo_xt", "2.31.10", XT_ROWS)
    _write(tmp_path / "zoo_diffusers", "0.42.1", [
        {"arch": "AttnProcessor2_0", "impl": "self", "status": "examined", "checks": [_check("padding", "pass")]}])
    readme = tmp_path / "README.md"
    readme.write_text("# R\n\n## Zoo\n<!-- BEGIN lab:zoo_xt_summary -->\nold\n<!-- END lab:zoo_xt_summary -->\nend\n")
    pages = []
    for _ in range(2):
        assert main(["--results", str(tmp_path), "--readme", str(readme)]) == 0
        pages.append((tmp_path / "DOCTOR.md").read_text())
        assert pages[-1].count("## The x-transformers zoo") == 1 and "\n\n\n" not in pages[-1]
        assert pages[-1].index("## The x-transformers zoo") < pages[-1].index("## The diffusers zoo")
    assert pages[0] == pages[1]
    assert "**4 of 6** targets" in readme.read_text() and "\nold\n" not in readme.read_text()


@pytest.mark.parametrize("name", ["zoo_xt", "zoo_diffusers"])
def test_library_sections_render_nothing_without_a_table(name, tmp_path):
    from doctor_lab.report.build import SECTIONS
    (mod,) = [m for m in SECTIONS if m.__name__.endswith("." + name)]
    assert mod.blocks([], tmp_path / "figures") == {}


def test_the_findings_section_lists_every_page_once_with_the_zoos_rows(tmp_path):
    """From the committed tables: every docs/findings/ page once (no page without its triage entry),
    and per zoo the rows its findings explain are those the zoo's section counts as findings."""
    import re
    import shutil

    from doctor_lab.report.sections import findings, zoo
    results = ROOT / "results"
    md = findings.blocks([], results / "doctor_figures")["findings"]
    pages = re.findall(r"^\| \[(\w+)\]\(\.\./docs/findings/\1\.md\) \| ", md, re.M)
    assert sorted(pages) == sorted(p.stem for p in (ROOT / "docs" / "findings").glob("*.md"))
    rows = {lib: sum(int(n) for n in re.findall(rf"^\| \[\w+\]\(\S+\) \| {lib} \S+ \| (\d+) \|", md, re.M))
            for lib in ("transformers", "x-transformers", "diffusers")}
    (tmp_path / "zoo").mkdir()   # the transformers zoo's current table alone (no pictures written into results/)
    shutil.copy(results / "zoo" / "zoo.json", tmp_path / "zoo" / "zoo.json")
    said = zoo.blocks([], tmp_path / "figures")["zoo"]
    counted = re.search(r"(\d+) new findings? \((\d+) rows?\), (\d+) findings? that needs? a random-init condition "
                        r"\((\d+) rows?\)", said)
    assert rows["transformers"] == int(counted[2]) + int(counted[4]) > 0
    md = findings.blocks([], tmp_path / "figures")["findings"]   # without the library zoos' tables: 0 rows there
    assert len(re.findall(r"^\| \[", md, re.M)) == len(pages) and "| x-transformers | 0 |" in md
