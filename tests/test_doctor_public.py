"""doctor_lab.public without the public sources: its registry agrees with the doctor's (every
check, outcome and cause an Expect names exists; every factory is there), a target whose source is
absent or lacks the class's file is "not measured" (never right) and the command exits non-zero,
judging reads each run, and the caller's probe sees a changed mode, dtype or complex buffer."""
import ast
import json
import re
from pathlib import Path

import pytest
import torch

from attention_doctor.checks import REGISTRY
from attention_doctor.result import OUTCOMES
from doctor_lab.public.__main__ import ROOT, judge, main
from doctor_lab.public.caller import differences, state
from doctor_lab.public.records import CALLER, EXIT, FACTORIES, SOURCE, SOURCES, TARGETS, Expect

CHECKS = {c.name: c for c in REGISTRY}


def test_every_expect_names_a_check_an_outcome_and_a_cause_of_the_doctor():
    assert len({t.name for t in TARGETS}) == len(TARGETS)
    for t in TARGETS:
        assert t.expects and (t.source in SOURCE or (not t.source and t.needs)), t.name
        for e in t.expects:
            assert e.why, (t.name, e.check)
            if e.check == EXIT:
                assert set(e.right) <= {"0", "1", "2", "3"}, t.name
            elif e.check == CALLER:
                assert e.right == ("unchanged",), t.name
            else:
                assert e.check in CHECKS, (t.name, e.check)
                assert set(e.right) <= {o.value for o in OUTCOMES}, (t.name, e.check)
                if e.cause:
                    cause = CHECKS[e.check].cause(e.cause)
                    assert cause is not None and cause.outcome.value in e.right, (t.name, e.cause)


def test_every_factory_is_there_and_every_source_is_pinned_and_used():
    for t in TARGETS:
        if ".py:" not in t.factory:
            continue
        file, _, fn = t.factory.partition(":")
        tree = ast.parse((ROOT / FACTORIES / file).read_text())
        assert fn in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, t.factory
        # a factory's name never shadows the package it imports (its folder goes first on sys.path)
        assert Path(file).stem not in {"olmo", "model", "nanochat", "torchtitan", "apps", "lingua"}
    titan = next(t for t in TARGETS if t.name == "torchtitan-llama3")
    assert "tyro" in titan.stubs() and "torchtitan.models.moe.kernels" in titan.stubs()   # read from its factory
    for s in SOURCES:
        assert re.fullmatch(r"[0-9a-f]{40}", s.commit) and any(t.source == s.name for t in TARGETS), s.name


def test_absent_sources_are_not_measured_never_right(tmp_path, capsys):
    code = main(["--only", "OLMo,nanochat-smear-on", "--source", f"nanochat={tmp_path}", "--out", str(tmp_path)])
    assert code == 3
    data = json.loads((tmp_path / "table.json").read_text())
    olmo, nanochat = data["targets"]
    assert olmo["status"] == ("not measured: pass --source OLMo=PATH (git clone https://github.com/allenai/OLMo OLMo "
                              "&& git -C OLMo checkout 59a53e3f68e5)")
    assert nanochat["status"].startswith(f"not measured: {tmp_path} has no nanochat/gpt.py")
    verdicts = [v["verdict"] for t in data["targets"] for v in t["verdicts"]]
    assert verdicts and not any(v in ("right", "wrong") for v in verdicts)
    assert "| OLMo | kv_cache | pass | - | not measured: pass --source OLMo=PATH" in (tmp_path / "table.md").read_text()
    with pytest.raises(SystemExit):
        main(["--source", "nanoGPT=/x"])


def _run(outcome, cause="", exit_code=1, measured=0.5):
    return {"exit_code": exit_code, "checks": {"kv_cache": {"outcome": outcome, "cause": cause, "measured": measured,
                                                            "reason": ""}}}


def test_judging_needs_every_run_right_with_its_cause():
    e = Expect("kv_cache", ("fail",), "planted", cause="new_tokens_differ")
    assert judge(e, [_run("fail", "new_tokens_differ")], None)["verdict"] == "right"
    assert judge(e, [_run("fail", "target_raised")], None)["verdict"] == "wrong"
    assert judge(e, [_run("fail", "new_tokens_differ"), _run("pass")], None)["verdict"] == "wrong"
    assert judge(e, [{"timed_out": 5, "seconds": 5, "load": 1}], None)["verdict"] == "wrong"
    assert judge(Expect(EXIT, ("0", "1", "3"), "not refused"), [_run("fail", exit_code=2)], None)["verdict"] == "wrong"
    assert judge(Expect(CALLER, ("unchanged",), "copies"), [], {"error": "raised"})["verdict"] == "wrong"
    cast = {"unchanged": False, "complex_buffers": ["freqs_cis"],   # the doctor before 485fa76 on torchtitan's class
            "differences": ["model: training True -> False", "w: torch.float64 (2,) on cpu -> torch.float32 (2,) on cpu",
                            "freqs_cis: torch.complex64 (8, 4) on cpu -> torch.float32 (8, 4) on cpu"]}
    v = judge(Expect(CALLER, ("unchanged",), "copies"), [], cast)
    assert v["verdict"] == "wrong" and v["measured"] == [
        "changed: 1 modules' mode, 2 tensors; freqs_cis: torch.complex64 (8, 4) on cpu -> torch.float32 (8, 4) on cpu"]


def test_the_callers_probe_sees_mode_dtype_and_a_complex_buffer_made_real():
    m = torch.nn.Linear(2, 2).double().train()
    m.register_buffer("freqs_cis", torch.polar(torch.ones(3), torch.arange(3.0)))
    before = state(m)
    assert differences(before, state(m)) == []
    m.eval()
    m.freqs_cis = m.freqs_cis.real
    m.float()
    changed = differences(before, state(m))
    assert ": training True -> False" in changed[0]
    assert any(c.startswith("freqs_cis: torch.complex64") for c in changed)
    assert any(c.startswith("weight: torch.float64") for c in changed)
