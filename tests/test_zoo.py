"""The zoo (experiments/zoo): the command on three architectures through the doctor, the
runner's isolation (a hang, a crash, memory exhaustion and a CPU hog are rows, not the end of
the run), resuming, the shrink table, bad input, and the report section."""
import csv
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import ROOT

pytest.importorskip("transformers")

from experiments.zoo import runner, worker  # noqa: E402
from experiments.zoo.shrink import load_table, make_config  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
ARCHS = ["gpt2", "llama", "deepseek_v2"]  # absolute positions; rotary with GQA; MLA from the shrink table


def zoo(*args, out):
    return subprocess.run([sys.executable, "-m", "experiments.zoo", *args, "--out", str(out)],
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
    ds = next(r for r in summary["results"] if r["arch"] == "deepseek_v2")
    assert ds["params"] < 2_000_000 and ds["shrink"]  # the table's entry built it, and says why
    # a second run finds everything done and leaves the result files as they were
    before = {f: f.stat().st_mtime_ns for f in (tmp_path / "runs").glob("*.json")}
    assert len(before) == 6
    from experiments.zoo.__main__ import main  # in this process: nothing is left to fork
    assert main(["--arch", *ARCHS, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "to run" not in out and "3 of 189 architectures examined" in out, out
    assert {f: f.stat().st_mtime_ns for f in (tmp_path / "runs").glob("*.json")} == before


def _fake_examine(arch, impl, table, checks):
    """Stands in for worker.examine_one inside the forked workers (they inherit the patch)."""
    if arch == "hang":
        time.sleep(600)
    if arch == "segv":
        import faulthandler
        faulthandler.disable()  # pytest's handler would print the crash on the test's stderr
        os.kill(os.getpid(), 11)
    if arch == "hog":
        bytearray(8 << 30)  # past the address-space cap: MemoryError
    if arch == "spin":
        while True:
            pass
    return {"arch": arch, "impl": impl, "status": "examined", "checks": []}


def _vm_size() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def test_runner_isolates_hang_crash_memory_and_cpu(tmp_path, monkeypatch):
    monkeypatch.setattr(worker, "examine_one", _fake_examine)
    archs = ["hang", "segv", "hog", "ok"]
    hashes = dict.fromkeys(archs + ["spin"], "h")
    tasks = runner.pending(archs, ["eager", "sdpa"], tmp_path, hashes)
    assert tasks == {a: ["eager", "sdpa"] for a in archs}
    seen = []
    runner.run(tasks, tmp_path, checks=None, table={"archs": {}}, hashes=hashes, workers=2,
               timeout_s=3, cpu_s=60, mem_bytes=_vm_size() + (1 << 30), progress=seen.append)
    # a busy loop meets the CPU cap (SIGXCPU) long before the wall clock, even on a loaded box
    runner.run({"spin": ["eager"]}, tmp_path, checks=None, table={"archs": {}}, hashes=hashes,
               timeout_s=300, cpu_s=1, mem_bytes=None, progress=seen.append)
    assert len(seen) == 5
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
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as M
    t = load_table()
    assert set(t["archs"]) <= set(M), set(t["archs"]) - set(M)
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
    from experiments.zoo.__main__ import main
    with pytest.raises(SystemExit) as e:
        main([*args, "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and names in err[0], err
    assert not (tmp_path / "runs").exists()


def test_report_section_counts_and_triage(tmp_path):
    from experiments.report.sections import zoo as section
    check = lambda name, verdict: {"name": name, "verdict": verdict, "measured": 0.5, "tolerance": "", "detail": ""}
    results = [
        {"arch": "gpt2", "impl": "eager", "status": "examined", "cpu_s": 1.0,
         "checks": [check("padding", "warn"), check("low_precision", "fail")]},
        {"arch": "gpt2", "impl": "sdpa", "status": "examined", "cpu_s": 1.0,
         "checks": [check("padding", "warn"), check("low_precision", "inconclusive: scores unseen")]},
        {"arch": "newarch", "impl": "eager", "status": "examined", "cpu_s": 1.0,
         "checks": [check("padding", "pass"), check("kv_cache", "fail")]},
        {"arch": "broken", "impl": "eager", "status": "timeout", "reason": "killed after 600 s wall clock"},
    ]
    (tmp_path / "zoo").mkdir()
    (tmp_path / "zoo" / "zoo.json").write_text(json.dumps({
        "transformers": "5.23.0", "torch": "2.13.0", "archs": 3, "examined": 2, "impls": ["eager", "sdpa"],
        "not_examined": {"broken": ["eager: timeout: killed after 600 s wall clock"]}, "not_run": [],
        "results": results}))
    blocks = section.blocks([], tmp_path / "figures")
    md = blocks["zoo"]
    assert "| eager | 2 | 1 |" in md and "| sdpa | 1 | 0 |" in md  # examined, timeout per implementation
    assert "| padding | 1 / 0 / 1 / 0 / 0 | 0 / 0 / 1 / 0 / 0 |" in md   # pass / fail / warn / n/a / inconclusive
    assert "| low_precision | 0 / 1 / 0 / 0 / 0 | 0 / 0 / 0 / 0 / 1 |" in md
    # triaged by experiments/zoo/triage.yaml: gpt2's warn and eager fail are known; newarch's fail is not
    assert "huggingface/transformers#21080" in md and "huggingface/transformers#33317" in md
    assert "| kv_cache | fail | **untriaged** | newarch (eager) |" in md
    assert "**broken**: eager: timeout" in md
    assert "**2 of 3**" in blocks["zoo_summary"] and "1 untriaged" in blocks["zoo_summary"]
