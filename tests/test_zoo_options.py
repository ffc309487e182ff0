"""The option zoo's discovery (doctor_lab/zoo/options.py) on a tiny fake model: a config field that
changes the attention code is found, one that changes the MLP only and one that changes nothing are
not; the row key that names options, read by the triage and the sentinel."""
import os
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from doctor_lab.report import triage  # noqa: E402
from doctor_lab.zoo import option_zoo, options, sentinel, table  # noqa: E402

HERE = str(Path(__file__).resolve().parent) + os.sep


@pytest.fixture(scope="module")
def found():
    import option_fakes
    option_fakes.register()
    return options.discover(option_fakes.MODEL_TYPE, ["eager"], {"generic": option_fakes.GENERIC, "archs": {}},
                            root=HERE)


def test_only_the_field_that_changes_attention_code_is_an_option(found):
    assert found["status"] == "discovered" and found["attention"] == ["attn"]
    tried = {t["label"]: t for t in found["tried"]}
    # every boolean of the class's own fields tried; the sizes the shrink sets are not candidates
    assert {"halve_scores=true", "gelu_mlp=true", "unused_flag=true", "zero_bias=true"} <= set(tried)
    assert not any(k.startswith(("hidden_size", "num_attention_heads", "vocab_size")) for k in tried)
    assert [k for k, t in tried.items() if t["found"]] == ["halve_scores=true", "zero_bias=true"]
    assert tried["halve_scores=true"]["by"] == ["lines", "outputs"] and tried["halve_scores=true"]["lines"] == 1
    assert tried["gelu_mlp=true"]["by"] == [] and not tried["gelu_mlp=true"]["error"]
    assert options.option_sets(found) == [{}, {"halve_scores": True}, {"zero_bias": True}]
    assert found["cost"]["wall_s"] > 0


def test_a_parameter_that_starts_at_zero_is_found_by_what_the_module_holds(found):
    """zero_bias adds a bias to the attention's projection that starts at zero: no output moves and
    no other line runs (measured here), but the attention module built holds a parameter more."""
    t = {t["label"]: t for t in found["tried"]}["zero_bias=true"]
    assert t["by"] == ["params"] and t["lines"] == 0 and t["impls"] == ["eager"]


def test_the_fields_of_a_sub_config_are_tried():
    """A composite config whose model reads text_config: its fields are candidates `text_config.x`,
    found as the flat config's are; the value reaches the sub-config over the shrink."""
    import option_fakes
    from doctor_lab.zoo.shrink import make_config
    option_fakes.register()
    table = {"generic": option_fakes.GENERIC, "archs": {}}
    cfg = make_config(option_fakes.COMPOSITE, table, {"text_config.halve_scores": True})
    assert cfg.text_config.halve_scores is True and cfg.text_config.hidden_size == 16 and not cfg.text_config.gelu_mlp
    d = options.discover(option_fakes.COMPOSITE, ["eager"], table, root=HERE)
    tried = {t["label"]: t for t in d["tried"]}
    assert {"text_config.gelu_mlp=true", "text_config.unused_flag=true"} <= set(tried)
    assert sorted(k for k, t in tried.items() if t["found"]) == ["text_config.halve_scores=true", "text_config.zero_bias=true"]
    assert tried["text_config.halve_scores=true"]["by"] == ["lines", "outputs"]


def test_a_job_per_option_set_and_its_row_key(found, tmp_path):
    jobs = option_zoo.jobs({"fake": found})
    assert sorted(v[1] == {} for v in jobs.values()) == [False, False, True] and "fake" in jobs
    rows = option_zoo.write_table(tmp_path, {"fake": found})
    assert [r["options"] for r in rows if r["found"] == "yes"] == ["halve_scores=true", "zero_bias=true"]
    assert (tmp_path / "options.csv").read_text().startswith("arch,options,kind,found,by")
    assert options.label({"use_sliding_window": True, "max_window_layers": 0}) == \
        "max_window_layers=0+use_sliding_window=true"
    assert options.value_label("rope_scaling", {"rope_type": "yarn", "factor": 2.0}) == "rope_scaling=yarn"


def _zoo(version, outcome):
    row = {"name": "sliding_window", "outcome": outcome, "cause": "window_ignored" if outcome == "fail" else ""}
    ok = {"name": "sliding_window", "outcome": "pass"}
    return {"transformers": version, "results": [
        {"arch": "qwen2", "impl": "eager", "status": "examined", "checks": [ok]},
        {"arch": "qwen2", "impl": "eager", "status": "examined", "checks": [row],
         "options": {"use_sliding_window": True}, "option_label": "use_sliding_window=true"}]}


def test_the_sentinel_and_the_triage_read_option_rows_apart():
    d = sentinel.compare(_zoo("4.47.1", "pass"), _zoo("4.48.0", "fail"), entries=[])
    assert [(c.arch, c.impl, c.check) for c in d.new_fails] == [("qwen2[use_sliding_window=true]", "eager", "sliding_window")]
    assert sentinel.compare(_zoo("4.48.0", "fail"), _zoo("4.49.0", "pass"), entries=[]).fixed[0].arch == \
        "qwen2[use_sliding_window=true]"
    (f,) = triage.flags(_zoo("4.48.0", "fail")["results"], "4.48.0")
    assert f["options"] == "use_sliding_window=true"
    rule = {"id": "x", "kind": "false_alarm", "note": "n", "check": "sliding_window", "archs": ["qwen2"]}
    for opts, hit in ((["use_sliding_window=*"], True), ([""], False), (["!use_sliding_window=*"], False)):
        e = {**rule, "options": opts, "rules": [{"check": "sliding_window", "archs": ["qwen2"], "options": opts}]}
        assert (triage.assign(f, [e]) is not None) is hit, opts
    assert triage.where([f]) == "qwen2[use_sliding_window=true] (eager)"
    assert table.key(_zoo("4.48.0", "fail")["results"][1]) == ("qwen2", "use_sliding_window=true", "eager")


def test_an_option_changes_the_default_before_the_shrink():
    """What an option switches on is shrunk as a default is: Qwen2's use_sliding_window brings its
    4096-token window, which the shrink makes 16; a per-layer list is given at the shrunk depth."""
    from doctor_lab.zoo.shrink import load_table, make_config
    t = load_table()
    assert make_config("qwen2", t).sliding_window is None
    on = make_config("qwen2", t, {"use_sliding_window": True})
    assert on.use_sliding_window is True and on.sliding_window == 16 and on.num_hidden_layers == 2
    kinds = ["sliding_attention", "full_attention"]
    assert make_config("qwen2", t, {"use_sliding_window": True, "layer_types": kinds}).layer_types == kinds



def test_an_option_a_shrink_derives_keeps_its_value():
    """The shrink derives Gemma's query_pre_attn_scalar from the shrunk head (16); an option that sets
    it (flat, or in a sub-config) is measured at its own value, not at the derived one."""
    from doctor_lab.zoo.shrink import load_table, make_config
    t = load_table()
    assert make_config("gemma2", t).query_pre_attn_scalar == 16
    assert make_config("gemma2", t, {"query_pre_attn_scalar": 4}).query_pre_attn_scalar == 4
    assert make_config("gemma3", t, {"text_config.query_pre_attn_scalar": 4}).text_config.query_pre_attn_scalar == 4


def test_the_cost_table_is_rendered_from_the_option_tables(tmp_path):
    """DOCTOR.md's option zoo cost: per release, the discovery's cost summed over options.json, each
    job's (architecture x option set) from its results, the command's from zoo.json; the whole
    release extrapolated, and said so, where a zoo table of that release gives its number of LMs."""
    import json

    from doctor_lab.report.sections import zoo_options as section
    fig = tmp_path / "doctor_figures"
    assert section.blocks([], fig) == {}
    d = tmp_path / "zoo_options" / "5.23.0"
    d.mkdir(parents=True)
    found = {"found": ["a=true"], "status": "discovered", "tried": 10, "cost": {"wall_s": 20.0, "cpu_s": 6.0}}
    (d / "options.json").write_text(json.dumps({"llama": found, "qwen2": {**found, "cost": {"wall_s": 40.0, "cpu_s": 10.0}}}))
    res = [{"arch": a, "option_label": o, "impl": i, "wall_s": 5.0, "cpu_s": c}
           for a, o, c in (("llama", "", 1.0), ("llama", "a=true", 2.0), ("qwen2", "", 3.0)) for i in ("eager", "sdpa")]
    (d / "zoo.json").write_text(json.dumps({"results": res, "cost": {"wall_s": 300.0, "cpu_s": 90.0, "workers": [2]}}))
    (tmp_path / "zoo").mkdir()
    (tmp_path / "zoo" / "zoo.json").write_text(json.dumps({"transformers": "5.23.0", "archs": 100}))
    text = section.blocks([], fig)[section.NAME]
    assert "| 5.23.0 | llama, qwen2 | 20 | 4 | 60 s / 16 s | 3 (eager+sdpa) | 10 s / 4.0 s; 10 s / 6.0 s | " \
           "5.0 min / 90 s (2 workers) |" in text
    # 100 x (8 CPU s of discovery + 2 sets x 4 CPU s a job) = 1,600 CPU s
    assert "**5.23.0, extrapolated, not measured**: its 100 causal LMs" in text and "200 jobs at 4.0 CPU s" in text
    assert "= 27 CPU min, about 13 min on 2 cores" in text


def test_a_rope_per_layer_kind_is_tried_per_kind():
    """Gemma 3's text_config holds a rope per layer kind (sliding, full): each kind's rope is set to
    each rope type, one at a time, and the value reaches that kind's rope in the sub-config."""
    from doctor_lab.zoo.shrink import load_table, make_config
    t = load_table()
    got = {c.label: c for c in options.candidates(make_config("gemma3", t), t["generic"])}
    linear = got["text_config.rope_parameters=full_attention:linear,sliding_attention:default"]
    assert "text_config.rope_parameters=full_attention:default,sliding_attention:yarn" in got
    rope = make_config("gemma3", t, {linear.field: linear.value}).text_config.rope_parameters
    assert (rope["full_attention"]["rope_type"], rope["sliding_attention"]["rope_type"]) == ("linear", "default")
