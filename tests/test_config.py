"""One home per default and per rule: attention/config.py's fields are what conf/model/small.yaml
says, the schema's model keys are those fields, and a config hash ignores a model key at its
declared default, so adding a field leaves every cached control valid."""
import dataclasses

import pytest

from attention.config import AttentionConfig, ModelConfig, config_fields, defaults
from experiments import schema
from experiments.records import config_hash


def test_the_dataclasses_defaults_are_the_yaml_defaults(compose_cfg):
    model = compose_cfg()["model"]
    declared = defaults()["model"]
    assert set(declared) == set(model) and set(declared["attention"]) == set(model["attention"])
    for key, value in declared.items():
        if key != "attention":
            assert model[key] == value and type(model[key]) is type(value), f"model.{key}"
    for key, value in declared["attention"].items():
        got = model["attention"][key]
        assert got == value and type(got) is type(value), f"model.attention.{key}"


def test_the_schema_s_model_keys_are_the_library_s_fields():
    model_keys = {k for k in schema.SCHEMA if k.startswith("model.")}
    assert model_keys == set(config_fields())
    for key, (_, allowed, _) in config_fields().items():
        assert schema.SCHEMA[key] is allowed  # the same object: one rule, not a copy


@pytest.mark.parametrize("overrides,message", [
    (dict(d_model=33, n_heads=2), "model.d_model=33 is not divisible by model.n_heads=2 (or set model.attention.d_k)"),
    (dict(n_heads=4, n_kv_heads=3), "model.n_kv_heads=3 does not divide model.n_heads=4"),
    (dict(backend="sdpa", upcast=True), "model.attention.backend='sdpa' cannot express upcast=true: use backend=explicit or auto"),
    (dict(backend="sdpa", mask_fill="minus_1e4"), "cannot express mask_fill='minus_1e4'"),
    (dict(softmax="fast"), "model.attention.softmax='fast' is not allowed: one of stable, naive, sum"),
])
def test_the_library_and_the_schema_reject_with_the_same_line(compose_cfg, overrides, message):
    with pytest.raises(ValueError) as direct:
        AttentionConfig(**overrides)
    cfg = compose_cfg()
    for k, v in overrides.items():
        (cfg["model"] if k in ("d_model", "n_heads", "n_kv_heads") else cfg["model"]["attention"])[k] = v
    with pytest.raises(schema.ConfigError) as through_schema:
        schema.validate(cfg)
    assert message in str(direct.value) and str(direct.value) == str(through_schema.value)


def test_a_model_key_at_its_declared_default_does_not_change_the_hash(compose_cfg, monkeypatch):
    cfg = compose_cfg(["+exp=no_scaling"])
    before = config_hash(cfg)
    # a new attention field, declared with its default, and a config that carries it at that default
    declared = defaults()
    declared["model"]["attention"]["new_toggle"] = None
    monkeypatch.setattr("experiments.records.defaults", lambda: declared)
    cfg["model"]["attention"]["new_toggle"] = None
    assert config_hash(cfg) == before
    cfg["model"]["attention"]["new_toggle"] = 3  # set away from its default: another config
    assert config_hash(cfg) != before
    # and an existing key moved from its default still counts
    cfg["model"]["attention"]["new_toggle"] = None
    cfg["model"]["attention"]["scale"] = "sqrt_dk"
    assert config_hash(cfg) != before


def test_cached_controls_keep_their_hash(compose_cfg):
    """These configs' hashes are the names of their cached control dirs: a change here retrains
    every cached control, so it must be one that changes what trains (then update the numbers)."""
    assert config_hash(compose_cfg(["+exp=baseline"])) == "b963d251ee29"   # 400 steps (conf/train/baseline.yaml)
    assert config_hash(compose_cfg(["+exp=no_scaling"])) == "11f4d04be9fb"


def test_a_field_without_a_key_is_not_a_config_key():
    assert "model.attention.rope" not in config_fields()  # set by the LM from model.pos
    assert "model.vocab_size" not in config_fields()      # from the task
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    assert {k.split(".")[-1] for k in config_fields() if k.count(".") == 1} <= names


def test_no_config_file_sets_a_key_twice():
    """YAML keeps the last of two equal keys without a word: a threshold edited in one copy of a
    check would silently lose to the other (it happened in conf/on_text/ once)."""
    import yaml

    from conftest import ROOT

    class Strict(yaml.SafeLoader):
        pass

    def mapping(loader, node, deep=False):
        keys = [loader.construct_object(k, deep=True) for k, _ in node.value]
        twice = sorted({k for k in keys if keys.count(k) > 1}, key=str)
        assert not twice, f"{node.start_mark.name}:{node.start_mark.line + 1}: {twice} set twice"
        return yaml.SafeLoader.construct_mapping(loader, node, deep)

    Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    files = sorted((ROOT / "conf").rglob("*.yaml"))
    assert len(files) > 50
    for f in files:
        with open(f) as stream:
            yaml.load(stream, Loader=Strict)
    with pytest.raises(AssertionError, match="set twice"):  # the check itself sees a duplicate
        yaml.load("a: 1\nb: {c: 1, c: 2}\n", Loader=Strict)
