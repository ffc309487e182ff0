"""The zoo (doctor_lab/zoo): the command on three architectures through the doctor, the
runner's isolation (a hang, a crash, memory exhaustion and a CPU hog are rows, not the end of
the run), resuming, the shrink table, bad input, and the report section."""
import csv
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, pad

pytest.importorskip("transformers")

from doctor_lab.report.triage import outcome  # noqa: E402
from doctor_lab.zoo import runner, worker  # noqa: E402
from doctor_lab.zoo.shrink import load_table, make_config  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
ARCHS = ["gpt2", "llama", "deepseek_v2"]  # absolute positions; rotary with GQA; MLA from the shrink table


def zoo(*args, out):
    return subprocess.run([sys.executable, "-m", "doctor_lab.zoo", *args, "--out", str(out)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)


def test_three_architectures_through_the_doctor_and_a_resume(tmp_path, capsys):
    p = zoo("--arch", *ARCHS, out=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = list(csv.DictReader(open(tmp_path / "zoo.csv")))
    from attention_doctor.checks import ORDER
    for arch in ARCHS:
        for impl in ("eager", "sdpa"):
            mine = [r for r in rows if r["arch"] == arch and r["impl"] == impl]
            assert [r["check"] for r in mine] == list(ORDER), (arch, impl)
            assert {r["status"] for r in mine} == {"examined"}
            assert all(r["verdict"] in ("pass", "fail", "warn") or r["verdict"].startswith(("n/a: ", "inconclusive: "))
                       for r in mine)
            assert all(r["cause"] for r in mine if r["verdict"] == "fail")   # the zoo can group fails by cause
            v = {r["check"]: r for r in mine}
            # healthy on what these architectures are known to get right
            for check in ("future_leak", "kv_cache", "batch_independence", "eval_dropout"):
                assert v[check]["verdict"] == "pass", (arch, impl, v[check])
            assert float(v["kv_cache"]["measured"]) <= 1e-5
    summary = json.loads((tmp_path / "zoo.json").read_text())
    assert summary["examined"] == 3 and summary["archs"] >= 189
    # the run's cost as a whole: wall and CPU time of the command and its workers, more than the checks'
    assert summary["cost"]["wall_s"] > 0 and summary["cost"]["cpu_s"] >= summary["cpu_s"] > 0
    assert summary["confirm"] == []  # every fail and warn of these three is a known behaviour: nothing to rerun
    ds = next(r for r in summary["results"] if r["arch"] == "deepseek_v2")
    assert ds["params"] < 2_000_000 and ds["shrink"]  # the table's entry built it, and says why
    # a second run finds everything done and leaves the result files as they were
    before = {f: f.stat().st_mtime_ns for f in (tmp_path / "runs").glob("*.json")}
    assert len(before) == 6
    from doctor_lab.zoo.__main__ import main  # in this process: nothing is left to fork
    assert main(["--arch", *ARCHS, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "to run" not in out and "3 of 189 architectures examined" in out, out
    assert {f: f.stat().st_mtime_ns for f in (tmp_path / "runs").glob("*.json")} == before


def test_runner_isolates_hang_crash_memory_and_cpu(tmp_path):
    # the runner forks: in a new process (zoo_fakes.py), never from this one, whose torch threads
    # may be running (a child forked then can wait on a futex forever)
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "zoo_fakes.py"), str(tmp_path)], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split()[-1] == "5"   # progress lines: one per architecture
    archs = ["hang", "segv", "hog", "ok"]
    hashes = dict.fromkeys(archs + ["spin"], "h")
    res = {(a, i): json.loads(worker.result_path(tmp_path, a, i).read_text())
           for a in archs for i in ("eager", "sdpa")}
    assert res[("hang", "eager")]["status"] == "timeout" and "wall clock" in res[("hang", "eager")]["reason"]
    assert res[("segv", "sdpa")]["status"] == "crash" and "SIGSEGV" in res[("segv", "sdpa")]["reason"]
    assert res[("hog", "eager")]["status"] == "memory"
    assert res[("hog", "sdpa")]["status"] == "memory"  # the next implementation ran after the first hit the cap
    assert res[("ok", "sdpa")]["status"] == "examined"
    spin = json.loads(worker.result_path(tmp_path, "spin", "eager").read_text())
    assert spin["status"] == "timeout" and "SIGXCPU" in spin["reason"]
    # resume: only what has no result (or a stale shrink) is pending
    worker.result_path(tmp_path, "ok", "sdpa").unlink()
    assert runner.pending(archs, ["eager", "sdpa"], tmp_path, {**hashes, "segv": "changed"}) == {
        "ok": ["sdpa"], "segv": ["eager", "sdpa"]}


def test_shrink_table():
    from doctor_lab.zoo import kinds
    t = load_table()
    gone = {a for a, e in t["archs"].items() if e.get("releases")}  # mapped by older releases only
    assert {a for a in set(t["archs"]) - gone if kinds.of(a) is None} == set()   # every entry a type of some kind
    c = make_config("t5", t)   # a seq2seq LM: its decoder as deep as its encoder
    assert (c.num_layers, c.num_decoder_layers) == (2, 2)
    c = make_config("qwen2_vl", t)   # M-RoPE's sections fit the shrunk head (half of 64 / 4)
    assert sum(c.text_config.rope_parameters["mrope_section"]) == 8
    assert all(e.get("why") or e.get("skip") for e in t["archs"].values())
    c = make_config("deepseek_v2", t)  # MLA: its own sizes, from the table
    assert (c.hidden_size, c.num_hidden_layers, c.kv_lora_rank, c.qk_rope_head_dim) == (64, 2, 16, 8)
    c = make_config("qwen3_next", t)  # a hybrid keeps one attention layer in two
    assert list(c.layer_types) == ["linear_attention", "full_attention"]
    c = make_config("gemma3", t)  # a text config nested in a multimodal one, per-layer lists derived again
    assert c.text_config.num_hidden_layers == 2 and len(c.text_config.layer_types) == 2
    c = make_config("gpt2", t)  # generic, through GPT-2's own attribute names
    assert (c.n_embd, c.n_layer, c.n_head, c.vocab_size) == (64, 2, 4, 128)


@pytest.mark.parametrize("args, names", [(["--arch", "no_such_model"], "no_such_model"),
                                         (["--checks", "kv_cache,nonsense"], "nonsense")])
def test_bad_input_is_one_line_and_exit_2(args, names, capsys, tmp_path):
    from doctor_lab.zoo.__main__ import main
    with pytest.raises(SystemExit) as e:
        main([*args, "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and names in err[0], err
    assert not (tmp_path / "runs").exists()


def _check(name, verdict, detail="", tolerance="<= 1e-05", m=None, **kw):
    return {"name": name, "verdict": verdict, "measured": 0.5, "tolerance": tolerance, "detail": detail,
            "measurements": m or {}, **kw}


def _table(results, version="5.23.0", **extra):
    return {"transformers": version, "torch": "2.13.0", "archs": len({r["arch"] for r in results}),
            "examined": len({r["arch"] for r in results if r["status"] == "examined"}), "impls": ["eager", "sdpa"],
            "not_examined": {}, "not_run": [], "results": results, **extra}


def test_report_section_counts_problems_and_rows(tmp_path):
    from doctor_lab.report.sections import zoo as section
    results = [
        {"arch": "gpt2", "impl": "eager", "status": "examined", "cpu_s": 1.0,
         "checks": [_check("padding", "warn", m=pad(1e-07, 0.7)), _check("low_precision", "fail")]},
        {"arch": "gpt2", "impl": "sdpa", "status": "examined", "cpu_s": 1.0,
         "checks": [_check("padding", "warn", m=pad(1e-07, 0.7)), _check("low_precision", "pass")]},
        {"arch": "llama", "impl": "eager", "status": "examined", "cpu_s": 1.0,
         "checks": [_check("padding", "pass"), _check("low_precision", "fail"), _check("long_positions", "n/a: needs x"),
                    _check("score_scale", "inconclusive: could not see the scores")]},
        {"arch": "newarch", "impl": "eager", "status": "examined", "cpu_s": 1.0,
         "checks": [_check("padding", "pass"), _check("kv_cache", "fail")]},
        {"arch": "newarch", "impl": "sdpa", "status": "examined", "cpu_s": 1.0,
         "checks": [_check("padding", "pass"), _check("kv_cache", "fail")]},
        {"arch": "broken", "impl": "eager", "status": "timeout", "reason": "killed after 600 s wall clock"},
    ]
    (tmp_path / "zoo").mkdir()
    (tmp_path / "zoo" / "zoo.json").write_text(json.dumps(_table(
        results, not_examined={"broken": ["eager: timeout: killed after 600 s wall clock"]},
        cost={"wall_s": 300.0, "cpu_s": 540.0, "sessions": 2, "workers": [2]})))
    blocks = section.blocks([], tmp_path / "figures")
    md = blocks["zoo"]
    assert "| eager | 3 | 1 |" in md and "| sdpa | 2 | 0 |" in md  # examined, timeout per implementation
    # each verdict class its own column: pass / fail / warn / n/a / inconclusive
    assert "pass / fail / warn / n/a / inconclusive" in md
    assert "| padding | 2 / 0 / 1 / 0 / 0 | 1 / 0 / 1 / 0 / 0 |" in md
    # the inconclusive row no entry of inconclusive.yaml explains: untriaged, loud, its share of the check rows
    assert "### Inconclusive (1 of 12 check rows, 8.33%)" in md
    assert "| untriaged:llama:score_scale | **untriaged** (score_scale) | 1 | llama (eager) |" in md
    # problems: gpt2's two warns are one problem (#21080), the two eager low_precision fails one (#33317),
    # newarch's two kv_cache fails one untriaged problem: 6 rows, 3 problems
    assert "6 fail or warn rows, **3 problems**" in md
    assert "| positions_from_padding | known behaviour" in md and "| 2 | gpt2 (eager+sdpa) |" in md
    assert "| qk_fp16_before_scale | known behaviour" in md and "huggingface/transformers#33317" in md
    assert "| untriaged:newarch:kv_cache | **untriaged** (kv_cache) | 2 | newarch (eager+sdpa) |" in md
    assert "**broken**: eager: timeout" in md
    assert "5.0 min wall, 9.0 min CPU over 2 sessions" in md  # the run's cost as a whole
    line = blocks["zoo_summary"]
    assert "**3 of 4**" in line and "6 fail or warn rows from **3 problems**" in line and "1 untriaged (2 rows)" in line


def test_triage_checks_the_row_against_its_reason():
    """Triage reads a row's outcome, cause and measurements (the doctor's schema), never its words:
    padding's sides from right, left and limit; an exception from the measurements that carry one;
    a rule's measures as records, ranges, patterns and absences."""
    from doctor_lab.report import triage
    assert triage.padding_sides(pad(0.00317, 0.97)) == {"right", "left"}
    assert triage.padding_sides(pad(1e-07, 0.97, 1e-07)) == {"left"}
    assert triage.padding_sides(pad(1e-07, 1e-07)) == set() and triage.padding_sides({}) is None
    entries = triage.load()
    row = lambda arch, m, verdict="fail", **kw: {"arch": arch, "impl": "eager", "check": "padding",  # noqa: E731
                                                 "verdict": verdict, "detail": "", "tolerance": "",
                                                 "cause": "", "measurements": m, **kw}
    # a decoder that fails left padding only is #19581's; one whose right padding fails is not
    assert triage.assign(row("bart", pad(6e-08, 0.65)), entries)["id"] == "decoder_positions_no_position_ids"
    assert triage.assign(row("bart", pad(0.003, 0.65)), entries) is None
    assert triage.assign(row("bart", {}), entries) is None
    # the doctor's own cause, where it names one, groups untriaged rows and must agree with an entry's causes
    lp = {"arch": "x", "impl": "eager", "check": "low_precision", "verdict": "fail", "detail": "", "tolerance": ""}
    assert triage.assign({**lp, "cause": ""}, entries)["id"] == "qk_fp16_before_scale"
    assert triage.assign({**lp, "cause": "mask fill overflows in float16"}, entries) is None
    ps = triage.problems([{**lp, "arch": a, "cause": "mask fill overflows in float16"} for a in ("x", "y")], entries)
    assert [(p["key"], len(p["rows"])) for p in ps] == [("cause:mask fill overflows in float16", 2)]
    # an error rule reads the exception a run raised, in the library's words
    raised = {**lp, "arch": "dbrx", "impl": "sdpa", "cause": "raised_in_low_precision", "measurements": {
        "nonfinite_runs": [{"batch": "plain", "mode": "autocast", "raised": "RuntimeError: index_add_(): self (Float)"}]}}
    assert triage.assign(raised, entries)["id"] == "dbrx_autocast_index_add"
    assert triage.assign({**raised, "measurements": {"nonfinite_runs": [{"raised": "RuntimeError: boom"}]}}, entries) is None
    # measures: a record among a list, a range, a pattern, None for absent; each item of a list of records
    match = triage._measure_matches
    runs = [{"batch": "plain", "scores": None}, {"batch": "left_padded", "scores": 30000.0, "nonfinite": 7}]
    assert match({"batch": "left_padded", "nonfinite": [1, 10]}, runs) and not match({"batch": "plain", "nonfinite": [1, 10]}, runs)
    assert match({"scores": "*"}, runs) and not match({"batch": "plain", "scores": "*"}, runs)
    assert match([{"batch": "plain"}, {"scores": 30000.0}], runs) and not match([{"batch": "plain"}, {"batch": "x"}], runs)
    assert match(None, None) and not match(None, 0.5) and not match([0, 1], True)
    # a word outside the doctor's outcomes (the old `skip`, nothing at all) is inconclusive, never a pass
    assert [triage.outcome({"verdict": v}) for v in ("pass", "warn: x", "skip: needs a KV cache", "n/a: no cache",
                                                     "inconclusive: raised", "")] == [
        "pass", "warn", "inconclusive", "n/a", "inconclusive", "inconclusive"]
    assert triage.outcome({"outcome": "fail", "verdict": "pass"}) == "fail"   # the schema's field, not the display


def test_triage_entries_are_problems_with_their_evidence():
    from doctor_lab.report import triage
    entries = triage.load()
    for e in entries:
        if e["kind"] == "finding":  # each finding's page exists, with its repro and patch beside it
            page = ROOT / e["finding"]
            assert page.is_file() and page.with_suffix(".py").is_file() and page.with_suffix(".patch").is_file(), e["id"]
    with pytest.raises(ValueError, match="id of its own"):
        bad = ROOT / "tests" / "_bad_triage.yaml"
        try:
            bad.write_text("- {id: a, kind: known, thread: x, check: padding}\n- {id: a, kind: known, thread: y, check: kv_cache}\n")
            triage.load(bad)
        finally:
            bad.unlink()


def test_over_releases_first_seen_and_fixed(tmp_path):
    """A problem present in one release and gone in the next, its architecture examined there, is
    fixed by the next (the Doge SDPA leak of 5.17.0, fixed by 5.23.0); one that stays is open."""
    from doctor_lab.report import releases
    from doctor_lab.report.sections import zoo as section
    leak = [_check("future_leak", "fail"), _check("kv_cache", "fail")]
    old = [{"arch": "doge", "impl": "sdpa", "status": "examined", "checks": leak},
           {"arch": "llama", "impl": "eager", "status": "examined", "checks": [_check("low_precision", "fail")]}]
    new = [{"arch": "doge", "impl": "sdpa", "status": "examined", "checks": [_check("future_leak", "pass")]},
           {"arch": "llama", "impl": "eager", "status": "examined", "checks": [_check("low_precision", "fail")]},
           {"arch": "newer", "impl": "eager", "status": "build_error", "reason": "x"}]
    root = tmp_path / "zoo"
    (root / "releases" / "5.17.0").mkdir(parents=True)
    (root / "releases" / "5.17.0" / "zoo.json").write_text(json.dumps(_table(old, "5.17.0", cost={"wall_s": 60, "cpu_s": 90})))
    (root / "zoo.json").write_text(json.dumps(_table(new, "5.23.0")))
    over = releases.over_releases(releases.load_tables(root))
    assert over["releases"] == ["5.17.0", "5.23.0"]
    q = {p["key"]: p for p in over["problems"]}
    assert (q["doge_sdpa_no_causal_mask"]["first_seen"], q["doge_sdpa_no_causal_mask"]["fixed_in"]) == ("5.17.0", "5.23.0")
    assert q["doge_sdpa_no_causal_mask"]["rows"] == {"5.17.0": 2}
    assert (q["qk_fp16_before_scale"]["first_seen"], q["qk_fp16_before_scale"]["fixed_in"]) == ("5.17.0", "")
    assert over["cells"]["doge"] == {"5.17.0": "known", "5.23.0": "pass"}
    assert over["cells"]["newer"] == {"5.17.0": "absent", "5.23.0": "not_examined"}
    csv_text = releases.to_csv(over)
    assert "doge_sdpa_no_causal_mask,known,5.17.0,5.23.0,doge,2,0," in csv_text
    md = section.blocks([], tmp_path / "figures")["zoo"]
    assert "### Across releases" in md and "| doge_sdpa_no_causal_mask | known behaviour | 5.17.0 | 5.23.0 | 2 | 0 |" in md
    assert "| 5.17.0 |  | 2 | 2 | 1.0 min | 1.5 min |" in md
    png = tmp_path / "figures" / section.FIGURE
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_conditions_label_what_a_row_needs():
    from doctor_lab.zoo.conditions import BY_NAME, needs
    reruns = {"float32": {"verdict": "fail"}, "float64": {"verdict": "fail"}, "seed1": {"verdict": "fail"},
              "pad_row": {"verdict": "pass"}, "pad_id": {"verdict": "n/a: nothing to change"}}
    assert needs({"outcome": "fail"}, reruns) == [BY_NAME["pad_row"].needs] == ["random-init artifact: needs a zero pad row"]
    assert needs({"outcome": "fail"}, {k: {"verdict": "fail"} for k in BY_NAME}) == []
    assert needs({"outcome": "pass"}, reruns) == []


def test_conditions_change_the_model():
    from doctor_lab.zoo.conditions import BY_NAME
    from doctor_lab.zoo.worker import build
    _, m, cfg = build("gpt2", "eager", load_table())
    assert BY_NAME["pad_row"].prepare(m, cfg) == ""  # GPT-2 has no zero pad row: n/a
    _, m, cfg = build("opt", "eager", load_table())
    emb = m.get_input_embeddings()
    assert bool((emb.weight[emb.padding_idx] == 0).all())
    assert "embed_tokens" in BY_NAME["pad_row"].prepare(m, cfg) and not bool((emb.weight[emb.padding_idx] == 0).all())
    assert "pad_token_id 1 -> None" in BY_NAME["pad_id"].prepare(m, cfg) and m.config.pad_token_id is None


def test_cost_adds_sessions_and_a_redo_starts_over(tmp_path):
    from doctor_lab.zoo import cost
    a = cost.Session(tmp_path, "k1", 2)
    a.record("archs_run")
    b = cost.Session(tmp_path, "k1", 2)
    b.record("archs_run")
    cost.Session(tmp_path, "other", 1).record("archs_run")
    t = cost.total(tmp_path, "k1")
    assert t["sessions"] == 2 and t["wall_s"] > 0 and t["cpu_s"] > 0
    cost.Session(tmp_path, "k1", 2, reset=True).record("archs_run")
    assert cost.total(tmp_path, "k1")["sessions"] == 1 and cost.total(tmp_path, "other")["sessions"] == 1


@pytest.mark.parametrize("args, says", [(["--release", "5.17.0"], "needs --pinned"),
                                        (["--transformers", "/nonexistent"], "holds no transformers package"),
                                        (["--release", "1.0", "--pinned", "/nonexistent"], "holds no transformers")])
def test_release_bad_input_is_one_line_and_exit_2(args, says, tmp_path):
    p = zoo(*args, out=tmp_path)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and says in err[0], p.stderr


def test_another_release_from_its_directory_and_the_table_over_releases(tmp_path):
    """--transformers DIR imports transformers from DIR (here a linked copy of the installed one),
    writes that release's table under releases/VERSION, and the table over releases beside."""
    from doctor_lab.zoo.findings import installed
    rel = tmp_path / "tf"
    rel.mkdir()
    (rel / "transformers").symlink_to(installed())
    out = tmp_path / "zoo" / "releases" / "copy"
    p = zoo("--transformers", str(rel), "--arch", "gpt2", "--impl", "eager", "--checks", "none", out=out)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "the table over releases" in p.stdout
    z = json.loads((out / "zoo.json").read_text())
    assert z["results"][0]["status"] == "ran" and z["cost"]["wall_s"] > 0
    assert (tmp_path / "zoo" / "releases.csv").read_text().startswith("problem,kind,first_seen,fixed_in")


def test_a_new_fail_is_rerun_under_each_condition_and_resumes(tmp_path):
    """XLM's padding fail (a new finding) is rerun under the five conditions; a second run redoes nothing."""
    p = zoo("--arch", "xlm", "--impl", "eager", out=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    rec = json.loads((tmp_path / "confirm" / "xlm__eager.json").read_text())
    assert rec["checks"] == ["padding"] and set(rec["conditions"]) == {"float32", "float64", "seed1", "pad_row", "pad_id"}
    assert all(outcome(c["padding"]) == "fail" for c in rec["conditions"].values())
    row = next(r for r in csv.DictReader(open(tmp_path / "zoo.csv")) if r["check"] == "padding")
    assert row["reruns"] == "float32:fail float64:fail seed1:fail pad_row:fail pad_id:fail" and row["needs"] == ""
    p = zoo("--arch", "xlm", "--impl", "eager", out=tmp_path)
    assert "to rerun" not in p.stdout and "to run" not in p.stdout


def test_the_lab_report_renders_from_committed_results(tmp_path):
    """`python -m doctor_lab.report --readme README.md` renders DOCTOR.md from results/zoo alone (no
    runs) and fills README's lab:zoo_summary block; the suite's block stays as it was, and the
    suite's README update leaves the lab's block alone."""
    from doctor_lab.report.build import main
    from experiments.report.markdown import update_readme
    (tmp_path / "zoo").mkdir()
    (tmp_path / "zoo" / "zoo.json").write_text(json.dumps(_table([
        {"arch": "gpt2", "impl": "eager", "status": "examined", "checks": [_check("low_precision", "fail")]}])))
    readme = tmp_path / "README.md"
    suite = "<!-- BEGIN report:catalogue -->\nsuite's\n<!-- END report:catalogue -->\n"
    readme.write_text(f"# R\n\n{suite}\n## Zoo\n<!-- BEGIN lab:zoo_summary -->\nold\n<!-- END lab:zoo_summary -->\nend\n")
    assert main(["--results", str(tmp_path), "--readme", str(readme)]) == 0
    text = (tmp_path / "DOCTOR.md").read_text()
    assert text.startswith("# The attention doctor's lab") and "## The zoo: transformers' causal LMs under the doctor" in text
    assert "1 fail or warn row, **1 problem**" in text and "## The attention doctor\n" not in text  # no evidence: no section
    filled = readme.read_text()
    assert "**1 of 1**" in filled and "\nold\n" not in filled and suite in filled and filled.endswith("end\n")
    # the suite fills its own block only, and names no missing block of the lab's
    assert update_readme(readme, {"catalogue": "new"}, tmp_path) == []
    assert readme.read_text() == filled.replace("suite's", "new")
    assert main(["--results", str(tmp_path / "nonsense")]) == 2


def test_the_lab_report_says_in_one_line_what_it_cannot_read(tmp_path, capsys):
    from doctor_lab.report.build import main
    (tmp_path / "zoo").mkdir()
    (tmp_path / "zoo" / "zoo.json").write_text("{not json")
    assert main(["--results", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: doctor_lab.report: JSONDecodeError") and err.count("\n") == 1
    assert not (tmp_path / "DOCTOR.md").exists()


def test_a_tower_this_machine_cannot_build_stands_in():
    """shrink.yaml's stand_in: AutoModel.from_config builds an empty module for the sub-configs of the
    classes named (Gemma3n's timm vision tower; a copy too, as from_pretrained loads one), the real
    model for any other, and is itself again afterwards."""
    import copy

    import torch
    from transformers import AutoModel, GPT2Config, OPTConfig

    from doctor_lab.zoo.worker import standing_in
    tower = GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16)
    text = OPTConfig(num_hidden_layers=1, hidden_size=8, num_attention_heads=2, ffn_dim=16, vocab_size=16,
                     word_embed_proj_dim=8)
    with standing_in([tower]):
        stand, again, real = (AutoModel.from_config(c) for c in (tower, copy.deepcopy(tower), text))
    assert not list(stand.parameters()) and not list(again.parameters()) and type(real).__name__ == "OPTModel"
    with pytest.raises(RuntimeError, match="stand-in"):
        stand(torch.zeros(1, 2))
    assert type(AutoModel.from_config(tower)).__name__ == "GPT2Model"


def test_a_rerun_that_changes_no_verdict_rewrites_nothing(tmp_path):
    """The committed table keeps its numbers where no verdict or cause changed (a rerun's noise, 9.03e-08 ->
    1.81e-07, leaves a clone clean); a changed verdict rewrites its row and keeps the others as they were."""
    from doctor_lab.zoo import table

    def result(arch, measured, verdict="pass"):
        return {"arch": arch, "impl": "eager", "status": "examined", "cpu_s": measured * 1e9,
                "checks": [{"name": "future_leak", "verdict": verdict, "cause": "" if verdict == "pass" else "outputs_move",
                            "measured": measured, "tolerance": "<= 1e-06", "detail": f"max {measured}"}]}

    def runs(*results):
        (tmp_path / "runs").mkdir(exist_ok=True)
        for r in results:
            (tmp_path / "runs" / f"{r['arch']}__eager.json").write_text(json.dumps(r))

    runs(result("gpt2", 9.03e-08), result("llama", 1e-08))
    table.write(tmp_path, ["gpt2", "llama"])
    before = {f: (tmp_path / f).read_bytes() for f in ("zoo.csv", "zoo.json")}
    runs(result("gpt2", 1.81e-07), result("llama", 2e-08))
    table.write(tmp_path, ["gpt2", "llama"])
    assert {f: (tmp_path / f).read_bytes() for f in before} == before
    runs(result("gpt2", 0.5, "fail"))
    table.write(tmp_path, ["gpt2", "llama"])
    rows = {r["arch"]: r for r in csv.DictReader(open(tmp_path / "zoo.csv"))}
    assert rows["gpt2"]["verdict"] == "fail" and rows["gpt2"]["measured"] == "0.5"
    assert rows["llama"]["measured"] == "1e-08"   # unchanged verdict: the committed number, not the rerun's 2e-08
    # a clone has the table, not the runs: a rerun of one architecture keeps the others' committed rows
    import shutil
    shutil.rmtree(tmp_path / "runs")
    runs(result("gpt2", 1e-09))
    table.write(tmp_path, ["gpt2", "llama"])
    rows = {r["arch"]: r for r in csv.DictReader(open(tmp_path / "zoo.csv"))}
    assert rows["gpt2"]["verdict"] == "pass" and rows["llama"]["measured"] == "1e-08"
    assert json.loads((tmp_path / "zoo.json").read_text())["examined"] == 2


def test_a_library_zoo_rerun_of_one_target_keeps_the_others_committed_rows(tmp_path):
    """x-transformers' and diffusers' zoos write through library.write: on a clone (the table, no runs)
    `--target A --redo` rewrites A's rows and keeps every other target's, as the transformers zoo does."""
    from doctor_lab.zoo import library

    def result(arch, verdict):
        return {"arch": arch, "impl": "self", "status": "examined",
                "checks": [{"name": "padding", "verdict": verdict, "cause": "" if verdict == "pass" else "left_padding",
                            "measured": 0.0 if verdict == "pass" else 0.5, "tolerance": "<= 1e-05", "detail": ""}]}

    def runs(*results):
        (tmp_path / "runs").mkdir(exist_ok=True)
        for r in results:
            (tmp_path / "runs" / f"{r['arch']}__self.json").write_text(json.dumps(r))

    meta = {"library": "lib", "version": "1.0"}
    runs(result("A", "pass"), result("B", "pass"))
    library.write(tmp_path, ["A", "B"], meta)
    import shutil
    shutil.rmtree(tmp_path / "runs")
    runs(result("A", "fail"))
    library.write(tmp_path, ["A", "B"], meta)
    rows = {r["target"]: r["verdict"] for r in csv.DictReader(open(tmp_path / "zoo.csv"))}
    assert rows == {"A": "fail", "B": "pass"}


def test_flex_attention_runs_eagerly_and_is_examined(tmp_path):
    """--impl flex_attention: compiled, transformers' flex forward raises on CPU (no return_lse there);
    the zoo runs it eagerly, and the doctor's padding and cache checks pass on Llama as on SDPA."""
    p = zoo("--arch", "llama", "--impl", "flex_attention", "--checks", "padding,kv_cache", "--no-confirm", out=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = list(csv.DictReader(open(tmp_path / "zoo.csv")))
    assert sorted((r["impl"], r["status"], r["check"], r["verdict"]) for r in rows) == [
        ("flex_attention", "examined", "kv_cache", "pass"), ("flex_attention", "examined", "padding", "pass")]
    assert all(float(r["measured"]) <= 1e-5 for r in rows)


def test_kinds_keep_the_default_run_causal_and_name_the_others():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as M

    from doctor_lab.zoo import kinds
    assert kinds.every() == list(M)   # the default run: the causal LMs, as before kinds
    assert kinds.of("bart")[:2] == ("causal_lm", "BartForCausalLM")   # first kind that maps it
    assert kinds.of("bart", ["seq2seq_lm"])[:2] == ("seq2seq_lm", "BartForConditionalGeneration")
    seq2seq = kinds.every(["seq2seq_lm"])
    assert {"t5", "bart", "marian"} <= set(seq2seq) and "llama" not in seq2seq
    assert kinds.of("paligemma")[0] == "image_text_to_text" and kinds.of("no_such_type") is None


def test_a_sub_config_that_rejects_unknown_keys_gets_only_those_it_names():
    """4.4x-5.0's DbrxAttentionConfig raises on the base config's generic keys that to_dict() gives
    back (DBRX was build_error on 4.46.3 and 5.0.0): the shrink passes it the keys its __init__ names;
    a class that takes the whole dict gets it whole."""
    from doctor_lab.zoo.shrink import _taken

    class Strict:
        def __init__(self, kv_n_heads=1, clip_qkv=None, **kwargs):
            if kwargs:
                raise ValueError(f"Found unknown kwargs={kwargs}")

    class Lenient:
        def __init__(self, kv_n_heads=1, **kwargs):
            pass
    kw = {"kv_n_heads": 2, "clip_qkv": 8.0, "return_dict": True, "is_decoder": True}
    assert _taken(Strict, kw) == {"kv_n_heads": 2, "clip_qkv": 8.0}
    assert _taken(Lenient, kw) == kw
