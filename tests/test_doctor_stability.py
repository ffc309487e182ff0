"""The gate does not move (doctor_lab/stability.py), shrunk: 2 healthy targets of the beds, 2 runs,
1 busy process; the flip count itself (a changed cause, a missing row, a run that could not
examine) and the runs that exit other than 0 or 3 on made-up runs. The full benchmark is `python -m doctor_lab.stability` (10 runs, 2 busy)."""
import json

import pytest

from attention_doctor.checks.catalogue import ORDER
from doctor_lab import stability
from doctor_lab.report.sections.doctor import stability as stability_section


def test_two_targets_two_runs_beside_a_busy_process_do_not_flip(capsys, tmp_path):
    # the spinner stops by itself after 5 s: beside CI's other worker a longer one would take a core
    # from it for the whole test (the full benchmark spins for as long as it runs)
    args = ["--runs", "2", "--busy", "1", "--busy-seconds", "5", "--targets", "mistral,fused_bmm"]
    code = stability.main([*args, "--out", str(tmp_path / "s.json")])
    out = capsys.readouterr().out
    # every registered check of each target: a row missing from a run would be a flip
    assert f"total: 0 flips over 2 runs x 2 targets ({2 * len(ORDER)} target-checks) beside 1 busy processes" in out, out
    assert code == 0
    assert {ln.split()[0] for ln in out.splitlines() if " flips " in ln and not ln.startswith("total")} == {
        "mistral", "fused_bmm"}
    # what the lab's report renders (results/doctor/stability.json): the command, the beds, the same totals
    kept = json.loads((tmp_path / "s.json").read_text())
    assert kept["command"].startswith("python -m doctor_lab.stability --runs 2 --busy 1") and len(kept["runs"]) == 2
    assert kept["beds"] == {"mistral": "styles", "fused_bmm": "styles"} and kept["busy"] == 1
    text = stability_section(kept)
    assert "**0 outcome flips** over " + str(2 * len(ORDER)) + " target-checks" in text
    assert "| styles | 2 | 0 | 0 | 0 |" in text, text


def test_a_flip_is_a_run_whose_outcome_or_cause_differs_from_the_first():
    run = lambda pad, cache: {"t": {"exit_code": 0, "rows": {"padding": pad, "kv_cache": cache}}}
    runs = [run(["pass", ""], ["fail", "a"]), run(["pass", ""], ["fail", "b"]), run(["warn", "x"], ["fail", "a"]),
            {"t": {"error": "boom"}}]
    f = stability.flips(runs)["t"]
    assert f == {"kv_cache": 2, "padding": 2, "(error)": 1}
    text, total = stability.report(runs, 1, 1.0)
    assert total == 6 and "exit codes seen [0, 'error']" in text   # 5 flips, 1 run that could not examine
    assert "1 target-runs exited other than 0 or 3" in text
    failed = [{"t": {"exit_code": 1, "rows": {"padding": ["fail", "x"]}}}] * 2   # steady, but a fail
    assert stability.report(failed, 1, 1.0)[1] == 2
    # the lab's report section counts the same: 5 flips, 1 run off, the bed's codes
    text = stability_section({"command": "c", "doctor": "d", "beds": {"t": "styles"}, "runs": runs, "busy": 1,
                              "cpus": 2, "wall_s": 60.0, "load": [3.0, 4.5]})
    assert "**5 outcome flips**" in text and "**1 target-runs exited other than 0 or 3**" in text
    assert "| styles | 1 | 5 | 0, error |" in text and "Flipped: t (kv_cache 2, padding 2, (error) 1)" in text


def test_the_beds_healthy_targets_and_bad_arguments():
    names = stability.targets()
    assert {"gpt_fast", "mistral", "decoder_layer", "nanogpt", "mha_subclass"} <= set(names) and len(names) == 20
    assert {n for n, bed in names.items() if bed == "hand_caches"} == {
        "own_cache", "input_pos", "presents_kv", "presents_latent", "presents_olmo"}
    assert stability.main(["--targets", "nope"]) == 2
    assert stability.main(["--runs", "1"]) == 2
    assert stability.main(["--generated", "3"]) == 2     # too few to hold every axis value
    assert stability.main(["--targets", "generated:not.a.style"]) == 2


def test_the_generated_healthy_targets_are_drawn_seeded_with_every_axis_value():
    from doctor_lab.generated import records
    drawn = stability.generated_names(8, seed=1)
    assert drawn == stability.generated_names(8, seed=1) and len(set(drawn)) == 8
    assert drawn != stability.generated_names(8, seed=2)
    values = {(axis, name) for d in drawn for axis, name in zip(records.AXES, d.split(":", 1)[1].split("."))}
    assert values == {(v.axis, v.name) for v in records.AXES_VALUES}
    assert {bed for n, bed in stability.targets(8, seed=1).items() if n in drawn} == {"generated"}


@pytest.mark.parametrize("name", ["mistral", "nanogpt", "own_cache", "presents_latent",
                                  "generated:matmul.separate.bool.layer.softmax.learned.none.default.d32_l2"])
def test_each_bed_builds_its_healthy_target(name):
    assert stability.build(name) is not None


def test_a_documented_hazard_is_expected_and_anything_else_is_not():
    """The gate judges a healthy target's exit code against its bed's hazards, as a maintainer's baseline
    does: Llama's and nanoGPT's q k^T before the scale fails low_precision by their formula; another
    cause there, another check failing, or a target without hazards still exits 1."""
    from attention_doctor.result import FAIL, PASS, DoctorResult, Row
    assert stability.hazards("llama") == stability.hazards("nanogpt") == (("low_precision", "qk_before_scale"),)
    assert stability.hazards("mistral") == stability.hazards("own_cache") == stability.hazards("einsum") == ()

    def code(name, *rows):
        r = DoctorResult(name, [Row("padding", PASS), *rows])
        r.baseline = stability.baseline(name)
        return r.exit_code
    hazard = Row("low_precision", FAIL, cause="qk_before_scale")
    assert code("nanogpt", hazard) == 0 and code("llama", hazard) == 0
    assert code("mistral", hazard) == 1                                          # declares no hazard
    assert code("nanogpt", Row("low_precision", FAIL, cause="scores_overflow")) == 1   # another cause
    assert code("nanogpt", hazard, Row("future_leak", FAIL, cause="later_key_moves")) == 1
