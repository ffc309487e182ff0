"""The schema: choices come from the tables that dispatch them, messages say what is allowed."""
import pytest

from experiments import schema
from experiments.schema import ConfigError, validate


def test_a_new_softmax_is_allowed_once_it_is_in_the_table(compose_cfg, monkeypatch):
    from attention import softmax
    cfg = compose_cfg(["model.attention.softmax=sparsemax"])
    with pytest.raises(ConfigError, match=r"^model\.attention\.softmax='sparsemax' is not allowed: one of stable, naive, sum$"):
        validate(cfg)
    monkeypatch.setitem(softmax.SOFTMAXES, "sparsemax", softmax.softmax_stable)
    validate(cfg)


def test_a_missing_key_is_named(compose_cfg):
    cfg = compose_cfg()
    del cfg["train"]["eval_batches"]
    with pytest.raises(ConfigError, match=r"^train\.eval_batches is missing from the config$"):
        validate(cfg)


def test_a_bool_is_not_a_number_and_a_number_is_not_a_bool():
    assert not schema.Key("int", lo=0).ok(True)
    assert not schema.Key("bool").ok(1)
    assert schema.Key("str", choices=("auto", True, False)).ok(False)
    assert not schema.Key("str", choices=("auto", True, False)).ok(0)
    assert schema.Key("float", lo=0, lo_open=True).ok(3)          # an int is a number
    assert not schema.Key("float", lo=0, lo_open=True).ok(float("inf"))


def test_keys_of_the_task_optimizer_and_logger_are_checked(compose_cfg):
    with pytest.raises(ConfigError, match=r"^optim\.momentum=1\.5 is not allowed: a number in \[0, 1\)$"):
        validate(compose_cfg(["optim=sgd", "optim.momentum=1.5"]))
    with pytest.raises(ConfigError, match=r"^logger\.mode='live' is not allowed: one of offline, online, disabled$"):
        validate(compose_cfg(["logger=wandb", "logger.mode=live"]))
    with pytest.raises(ConfigError, match=r"^data\.min_len=9, data\.max_len=8"):
        validate(compose_cfg(["data=padded_copy", "data.min_len=9", "data.max_len=8"]))


def test_the_schema_table_lists_every_choice():
    table = schema.markdown()
    assert "| `model.attention.softmax` | one of stable, naive, sum |" in table
    assert "| `train.dtype` | one of auto, float32, bfloat16, float16 |" in table


def test_every_task_optimizer_and_logger_has_its_keys_in_the_schema():
    from data import TASKS
    from experiments.training.build import OPTIMIZERS
    from experiments.training.logger import LOGGERS
    assert set(schema.TASK_KEYS) == set(TASKS)
    assert set(schema.OPTIM_KEYS) == set(OPTIMIZERS)
    assert set(schema.LOGGER_KEYS) == set(LOGGERS)


def test_docs_config_page_is_the_schema():
    from pathlib import Path
    page = (Path(__file__).resolve().parents[1] / "docs" / "config.md").read_text()
    block = page.split(schema.BEGIN, 1)[1].split(schema.END, 1)[0]
    assert block == "\n" + schema.markdown(), "run: python -m experiments.schema --write docs/config.md"


@pytest.mark.parametrize("overrides, message", [
    (["+train.step=100"], "train.step is not a config key (did you mean train.steps?)"),
    (["+trian.steps=3"], "trian.steps is not a config key (did you mean train.steps?)"),
    (["+data.pad_side=left"], "data.pad_side is not a key of data=copy"),
    (["+exp.contrl=3"], "exp.contrl is not a config key (did you mean exp.control?)"),
    (["+exp=no_scaling", "+exp.checks.platau.value=30"], "exp.checks.platau is not a check of no_scaling (did you mean plateau?)"),
    (["+exp=no_scaling", "+exp.checks.plateau.valu=30"], "exp.checks.plateau.valu is not a check field (did you mean value?)"),
])
def test_a_key_nobody_reads_is_an_error_naming_the_closest_key(compose_cfg, overrides, message):
    """Issue 23: `+train.step=100` trained 600 steps with a key nobody read."""
    from experiments.training.runner import preflight
    with pytest.raises(ValueError) as e:
        preflight(compose_cfg(overrides))
    assert str(e.value) == message


def test_the_closest_name_comes_first():
    from experiments.suggest import closest
    assert closest("no_scalng", ["baseline", "phase_no_scaling", "no_scaling"])[0] == "no_scaling"
    assert closest("zzz", ["baseline", "no_scaling"]) == []
