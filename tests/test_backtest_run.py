"""The backtest's one command (python -m doctor_lab.backtest): its verdicts read from fake zoo tables
(zoo.json rows as the zoo writes them, in tmp_path), the table and the report's section written from
them, and its bad input. No install, no zoo run: `--table` reads the runs that are there."""
import csv
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from doctor_lab.backtest import __main__ as cli
from doctor_lab.backtest import outcomes, plan, record, table
from doctor_lab.report.sections import backtest as section

ROOT = Path(__file__).resolve().parents[1]
ENTRIES = {e.id: e for e in record.load()}
CHECKS = record.registered_checks()
GPT = ENTRIES["gpt_sdpa_cache_no_mask"]          # kv_cache on gpt_neox, gpt2 x sdpa: 4.41.2 / 4.42.0 / 4.43.0


def kv(outcome: str, measured: float, cause: str = "") -> dict:
    """A kv_cache row as zoo.json holds it (the doctor's Row.to_dict, slimmed)."""
    return {"name": "kv_cache", "outcome": outcome, "reason": "", "cause": cause, "measured": measured,
            "tolerance": "<= 1e-05", "measurements": {"limit": 1e-5}, "detail": "", "verdict": outcome}


def zoo_table(runs: Path, release: str, results: dict, checks=("kv_cache",)) -> None:
    """runs/<release>/<checks>/zoo.json with one result per (arch, impl): a check row, or a status."""
    write_zoo(plan.run_dir(runs, release, checks), release, results)


def write_zoo(d: Path, release: str, results: dict) -> None:
    d.mkdir(parents=True, exist_ok=True)
    rows = []
    for (arch, impl), got in results.items():
        if isinstance(got, str):
            rows.append({"arch": arch, "impl": impl, "status": got, "reason": f"{arch} does not support {impl}"})
        else:
            rows.append({"arch": arch, "impl": impl, "status": "examined", "checks": [got]})
    (d / "zoo.json").write_text(json.dumps({"transformers": release, "results": rows}))


def judged(runs: Path, before, introduced, fixed) -> outcomes.Verdict:
    """The gpt entry's verdict when both architectures give these on the three releases."""
    for release, got in (("4.41.2", before), ("4.42.0", introduced), ("4.43.0", fixed)):
        if got is not None:
            zoo_table(runs, release, {("gpt_neox", "sdpa"): got, ("gpt2", "sdpa"): got})
    p = plan.plan(GPT, CHECKS)
    return outcomes.verdict(p, outcomes.cells(p, runs))


FAIL = kv("fail", 0.281, "new_tokens_differ")
PASS = kv("pass", 2.7e-7)


@pytest.mark.parametrize("before, introduced, fixed, kind, says", [
    (PASS, FAIL, PASS, "caught", "fail (new_tokens_differ, 0.281) on gpt_neox/sdpa, gpt2/sdpa; clean before and after"),
    ("unsupported", FAIL, PASS, "caught", "unsupported, the implementation did not exist"),
    (FAIL, FAIL, PASS, "caught, imprecise", "also on 4.41.2 (before)"),
    (None, FAIL, PASS, "caught, unbracketed", "4.41.2 (before): not run: not run yet"),
    (PASS, PASS, PASS, "missed", "kv_cache on 4.42.0: pass (2.7e-07)"),
    (PASS, {**PASS, "outcome": "inconclusive", "reason": "cache refused"}, PASS, "missed", "inconclusive: cache refused"),
    (PASS, None, PASS, "not run", "not run: not run yet on gpt_neox/sdpa, gpt2/sdpa"),
])
def test_the_verdict_of_an_entry_from_its_zoo_rows(tmp_path, before, introduced, fixed, kind, says):
    v = judged(tmp_path, before, introduced, fixed)
    assert v.kind == kind and says in v.text, v


def test_a_warn_is_caught_and_a_failed_install_or_a_refusing_zoo_says_why_not(tmp_path):
    from doctor_lab.backtest import runner
    from experiments.io import write_json
    assert judged(tmp_path / "a", PASS, {**FAIL, "outcome": "warn"}, PASS).kind == "caught"
    write_json(runner.install_error_path(tmp_path / "b", "4.42.0"), {"error": "pip: no such version"})
    assert "install failed: pip: no such version" in judged(tmp_path / "b", PASS, None, PASS).text
    d = plan.run_dir(tmp_path / "c", "4.42.0", ("kv_cache",))
    for arch in ("gpt_neox", "gpt2"):
        write_json(runner.attempt_path(d, arch), {"rc": 2, "said": "zoo: not in transformers 4.42.0's mapping"})
    v = judged(tmp_path / "c", PASS, None, PASS)
    assert v.kind == "not run" and "the zoo exited 2: zoo: not in transformers 4.42.0's mapping" in v.text


def test_a_probe_entry_is_missed_whatever_its_nearest_checks_say(tmp_path, monkeypatch):
    e = dataclasses.replace(ENTRIES["paligemma_training_pads_unmasked"], check="packed_sequences")
    monkeypatch.setitem(plan.NEAREST, "packed_sequences", ("padding",))
    assert e.check in record.PROBES and e.check not in CHECKS
    p = plan.plan(e, CHECKS)
    assert p.nearest and p.checks == plan.NEAREST[e.check]
    moved = {"name": "padding", "outcome": "fail", "cause": "left_padding", "measured": 0.5}
    zoo_table(tmp_path, e.introduced, {(a, i.value): moved for a in e.architectures for i in e.implementations},
              p.checks)
    v = outcomes.verdict(p, outcomes.cells(p, tmp_path))
    assert v.kind == "missed" and v.text.startswith("needs probe packed_sequences; nearest padding: caught")
    bare = plan.plan(e, CHECKS, nearest=False)
    assert bare.checks == () and outcomes.verdict(bare, outcomes.cells(bare, tmp_path)).text.endswith("no nearest check run")


def test_table_recall_and_report_from_runs_there_are(tmp_path, capsys):
    """--table: no install, no zoo; the whole record in backtest.csv/json/md, the recall printed, the
    report's section and README line rendered from backtest.json."""
    out = tmp_path / section.RESULTS     # results/backtest, as the report finds it
    judged(out / "runs", PASS, FAIL, PASS)
    assert cli.main(["--table", "--out", str(out)]) == 0
    held = sum(table.reproducible(e) for e in ENTRIES.values())      # the record grows: counted, not fixed
    probes = sum(e.check in record.PROBES for e in ENTRIES.values())
    assert f"recall: 1 caught of {held} CPU-reproducible regressions" in capsys.readouterr().out
    rows = list(csv.DictReader(open(out / "backtest.csv")))
    assert {r["id"] for r in rows} == set(ENTRIES)
    mine = [r for r in rows if r["id"] == GPT.id]
    assert len(mine) == 6 and {r["verdict"] for r in mine} == {"caught"}
    got = {(r["release"], r["arch"]): (r["outcome"], r["cause"], r["measured"]) for r in mine}
    assert got[("4.42.0", "gpt2")] == ("fail", "new_tokens_differ", "0.281")
    s = json.loads((out / "backtest.json").read_text())
    assert s["recall"] == {"caught": 1, "imprecise": 0, "reproducible": held, "entries": len(ENTRIES),
                           "needs_probe": probes}
    md = (out / "backtest.md").read_text()
    assert md.startswith("# The backtest") and "**fail (new_tokens_differ, 0.281)**" in md
    b = section.blocks([], tmp_path / "doctor_figures")
    assert b["backtest"].startswith(section.TITLE) and b["backtest"][1:] == md
    line = b["backtest_summary"]
    assert f"**recall 1 of {held}**" in line and section.COMMAND in line and line.count("\n") == 1


def test_the_report_says_in_one_line_that_there_is_no_backtest(tmp_path):
    b = section.blocks([], tmp_path / "doctor_figures")
    assert b["backtest_summary"].startswith("No backtest committed") and b["backtest_summary"].count("\n") == 1
    assert b["backtest"].startswith(section.TITLE)


@pytest.mark.parametrize("args, says", [
    (["--ids", "no_such_regression"], "backtest: no entry no_such_regression in"),
    (["--pinned", "{tmp}/a_file/pinned"], "backtest: --pinned {tmp}/a_file/pinned cannot be made"),
    (["--workers", "0"], "backtest: --workers and --cpu are at least 1"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, says):
    (tmp_path / "a_file").write_text("")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    r = subprocess.run([sys.executable, "-m", "doctor_lab.backtest", *args, "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith(says.replace("{tmp}", str(tmp_path))), r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and not (tmp_path / "out").exists()


def test_a_zoo_call_is_skipped_only_when_its_results_are_current(tmp_path, monkeypatch):
    """A resumed backtest skips an architecture whose results carry the key the zoo stamps (shrink
    entry, doctor, release, checks) and that zoo.json holds; another doctor's result is run again."""
    from doctor_lab.backtest import runner
    from doctor_lab.zoo.shrink import entry_hash, load_table
    from experiments.io import write_json
    shrink = load_table()
    monkeypatch.setattr(runner, "_doctor_hash", lambda: "doc1")
    key = f"{entry_hash('gpt2', shrink)}-doc1-tf4.42.0-kv_cache"
    write_json(tmp_path / "runs" / "gpt2__sdpa.json", {"arch": "gpt2", "impl": "sdpa", "shrink_hash": key})
    assert not runner.current(tmp_path, "4.42.0", "gpt2", ["sdpa"], ["kv_cache"], shrink)   # no zoo.json yet
    write_zoo(tmp_path, "4.42.0", {("gpt2", "sdpa"): PASS})
    assert runner.current(tmp_path, "4.42.0", "gpt2", ["sdpa"], ["kv_cache"], shrink)
    assert not runner.current(tmp_path, "4.42.0", "gpt2", ["sdpa", "eager"], ["kv_cache"], shrink)
    monkeypatch.setattr(runner, "_doctor_hash", lambda: "doc2")
    assert not runner.current(tmp_path, "4.42.0", "gpt2", ["sdpa"], ["kv_cache"], shrink)


def test_an_entry_with_config_values_runs_apart_and_gives_them_to_the_zoo(tmp_path, monkeypatch):
    """An entry whose regression needs a value the zoo's shrunk config lacks (a window) runs in a dir of
    its own, its zoo calls carry the values (--init), and its results are keyed by them."""
    from doctor_lab.backtest import runner
    from doctor_lab.zoo.shrink import entry_hash, load_table, parse_values, with_init
    e = ENTRIES["sliding_window_dropped_cache_position"]
    assert dict(e.config) == {"sliding_window": 16}
    p = plan.plan(e, CHECKS)
    assert plan.run_dir(tmp_path, "4.42.0", p.checks, e.config).name == "sliding_window@sliding_window=16"
    assert plan.run_dir(tmp_path, "4.42.0", p.checks).name == "sliding_window"
    cmd = runner.zoo_command("4.42.0", tmp_path, tmp_path, "phi3", ["eager"], p.checks, 300, e.config)
    assert cmd[cmd.index("--init") + 1:] == ["sliding_window=16"]
    assert parse_values(cmd[cmd.index("--init") + 1:]) == {"sliding_window": 16}
    shrink = load_table()
    given = with_init(shrink, ["phi3"], dict(e.config))
    assert given["archs"]["phi3"]["init"]["sliding_window"] == 16 and "phi3" not in shrink["archs"]
    assert entry_hash("phi3", given) != entry_hash("phi3", shrink)
    monkeypatch.setattr(runner, "_doctor_hash", lambda: "doc1")
    from experiments.io import write_json
    write_json(tmp_path / "runs" / "phi3__eager.json",
               {"arch": "phi3", "impl": "eager", "shrink_hash": f"{entry_hash('phi3', given)}-doc1-tf4.42.0-sliding_window"})
    write_zoo(tmp_path, "4.42.0", {("phi3", "eager"): PASS})
    assert runner.current(tmp_path, "4.42.0", "phi3", ["eager"], ["sliding_window"], shrink, e.config)
    assert not runner.current(tmp_path, "4.42.0", "phi3", ["eager"], ["sliding_window"], shrink)


@pytest.mark.parametrize("args, says", [
    (["--init", "sliding_window", "--out", "{tmp}"], "give KEY=VALUE"),
    (["--init", "sliding_window=16"], "--init needs --out"),
])
def test_the_zoos_init_refuses_bad_input_in_one_line(tmp_path, args, says):
    pytest.importorskip("transformers", reason="the zoo reads --init after transformers: requirements-validation.txt")
    args = [a.replace("{tmp}", str(tmp_path / "zoo")) for a in args]
    r = subprocess.run([sys.executable, "-m", "doctor_lab.zoo", "--arch", "gpt2", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_option_zoos_rows_bracket_an_entry_without_its_config(tmp_path):
    """--options: the entry's hand-written config is unused; each option set the option zoo examined is
    a row of its own, bracketed as an architecture is (an option set one release lacks: not run there)."""
    from doctor_lab.backtest import runner
    e = ENTRIES["qwen2_sliding_window_refactor"]
    p = plan.plan(e, CHECKS, options=True)
    assert e.config and p.config == ()
    d = {r: plan.run_dir(tmp_path, r, p.checks, p.config, p.options) for r in ("4.47.1", "4.48.0", "4.49.0")}
    assert d["4.48.0"].name == "sliding_window@options"

    def row(outcome):
        return {"name": "sliding_window", "outcome": outcome, "reason": "", "measured": 0.299 if outcome == "fail" else 0.0,
                "cause": "window_ignored" if outcome == "fail" else "", "measurements": {}, "detail": ""}
    for release, got in (("4.47.1", "pass"), ("4.48.0", "fail"), ("4.49.0", "pass")):
        d[release].mkdir(parents=True)
        rs = [{"arch": "qwen2", "impl": i, "status": "examined", "checks": [row("pass")]} for i in p.impls]
        rs += [{"arch": "qwen2", "impl": i, "status": "examined", "checks": [row(got)], "options": {"use_sliding_window": True},
                "option_label": "use_sliding_window=true"} for i in p.impls]
        (d[release] / "zoo.json").write_text(json.dumps({"transformers": release, "results": rs}))
    cs = outcomes.cells(p, tmp_path)
    assert {c.pair for c in cs} == {"qwen2/eager", "qwen2/sdpa", "qwen2[use_sliding_window=true]/eager",
                                     "qwen2[use_sliding_window=true]/sdpa"}
    v = outcomes.verdict(p, cs)
    assert v.kind == "caught" and "on qwen2[use_sliding_window=true]/eager, qwen2[use_sliding_window=true]/sdpa" in v.text
    assert section._details(table.entry(p, cs, v))[-1].startswith("| qwen2_sliding_window_refactor | "
                                                                  "qwen2[use_sliding_window=true]/sdpa |")
    (d["4.47.1"] / "zoo.json").write_text(json.dumps({"transformers": "4.47.1", "results": rs[:2]}))   # the set absent
    assert outcomes.verdict(p, outcomes.cells(p, tmp_path)).kind == "caught, unbracketed"
    cmd = runner.zoo_command("4.48.0", tmp_path, d["4.48.0"], "qwen2", ["eager"], p.checks, 300, p.config, ("--options",))
    assert cmd[-1] == "--options" and "--init" not in cmd


def test_an_entry_of_another_library_runs_through_its_own_zoo_and_is_judged(tmp_path):
    """x-transformers' entry: its architectures are the xt zoo's targets, eager/SDPA its einsum/flash paths,
    each release in a prefixed dir, the zoo called with the release first on PYTHONPATH (no --options, no
    --init); its verdict read from that zoo's rows as a transformers entry's is."""
    from doctor_lab.backtest import __main__ as cli
    from doctor_lab.backtest import runner
    e = ENTRIES["xt_qk_norm_scaled_twice"]
    p = plan.plan(e, CHECKS, options=True)
    assert (p.checks, p.impls, p.options, p.zoo) == (("score_scale",), ("einsum", "flash"), False, "doctor_lab.zoo_xt")
    assert p.run_dir(tmp_path, "2.17.1") == tmp_path / "xt-2.17.1" / "score_scale"
    todo = cli.calls([p], tmp_path)
    assert sorted(d.parent.name for d in todo) == ["xt-2.17.0", "xt-2.17.1", "xt-2.25.5"]
    assert {(c.library, c.arch, c.impls) for cs in todo.values() for c in cs} == {
        ("x-transformers", a, ("einsum", "flash")) for a in e.architectures}
    cmd = runner.zoo_command("2.17.1", tmp_path, tmp_path / "o", "attn_qk_norm", p.impls, p.checks, 300,
                             library=e.library)
    assert cmd[1:3] == ["-m", "doctor_lab.zoo_xt"] and cmd[cmd.index("--target") + 1] == "attn_qk_norm"
    assert cmd[cmd.index("--path") + 1] == "einsum,flash" and "--init" not in cmd and "--release" not in cmd
    env = runner.library_env("2.17.1", tmp_path, e.library)
    assert env["PYTHONPATH"].split(":")[0] == str((tmp_path / "xt-2.17.1").resolve())
    assert runner.library_env("4.42.0", tmp_path, "transformers") is None

    def score(outcome, m):
        return {"name": "score_scale", "outcome": outcome, "reason": "", "cause": "scores_too_sharp" if outcome == "fail"
                else "", "measured": m, "measurements": {}, "detail": ""}
    for release, got in (("2.17.0", score("pass", 3.9)), ("2.17.1", score("fail", 388.7)), ("2.25.5", score("pass", 3.9))):
        write_zoo(p.run_dir(tmp_path, release), release, {(a, i): got for a in e.architectures for i in p.impls})
    cs = outcomes.cells(p, tmp_path)
    v = outcomes.verdict(p, cs)
    assert v.kind == "caught" and "attn_qk_norm/einsum" in v.text and "clean before and after" in v.text
    page = section.render(table.summary([table.entry(p, cs, v)], None))
    assert "| xt_qk_norm_scaled_twice (x-transformers) | score_scale |" in page
    write_zoo(p.run_dir(tmp_path, "2.17.1"), "2.17.1", {(a, i): score("pass", 3.9) for a in e.architectures for i in p.impls})
    assert outcomes.verdict(p, outcomes.cells(p, tmp_path)).kind == "missed"   # a miss stays a miss
    wan = plan.plan(ENTRIES["wan_rope_axes_split"], CHECKS)
    assert wan.impls == ("self", "cross") and wan.release_dir("0.35.0") == "df-0.35.0"


def test_the_table_judges_an_entry_by_the_option_zoo_where_a_run_made_its_rows(tmp_path):
    """An entry is judged by the option zoo's rows when its introducing release has them (a --options run of
    it), else by its config's; the table says which."""
    e = ENTRIES["falcon_alibi_sdpa_no_mask_not_causal"]
    a = cli.parse(["--out", str(tmp_path)])
    assert not cli.judged(e, CHECKS, a).options
    p = plan.plan(e, CHECKS, options=True)
    write_zoo(p.run_dir(tmp_path / "runs", e.introduced), e.introduced, {("falcon", "sdpa"): PASS})
    assert not cli.judged(e, CHECKS, a).options   # the introducing release alone: another entry's run, maybe
    write_zoo(p.run_dir(tmp_path / "runs", e.fixed), e.fixed, {("falcon", "sdpa"): PASS})
    assert not cli.judged(e, CHECKS, a).options
    from doctor_lab.backtest import runner  # a zoo call that wrote no result (a release the option zoo cannot build)
    from experiments.io import write_json
    write_json(runner.attempt_path(p.run_dir(tmp_path / "runs", e.before), "falcon"), {"rc": 0, "said": "0 sets"})
    judged = cli.judged(e, CHECKS, a)
    assert judged.options and judged.config == ()
    assert table.entry(judged, [], outcomes.Verdict("missed", ""))["options"] is True
