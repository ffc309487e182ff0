"""conf/ composed outside run.py (benchmarks, tests, notebooks), and reading it: conf/ is the one
place a default lives, so code reads keys without fallbacks and a missing one is an error naming it."""
from pathlib import Path

from experiments.schema import ConfigError

CONF = Path(__file__).resolve().parents[1] / "conf"


def need(section: dict, path: str):
    """section[last part of path]; a missing key is an error naming the dotted `path`, as the
    schema's (experiments.schema validates whole configs in preflight; this guards direct callers)."""
    key = path.rsplit(".", 1)[-1]
    try:
        return section[key]
    except (KeyError, TypeError):
        raise ConfigError(f"{path} is missing from the config") from None


def exp_as_choice(overrides) -> list[str]:
    """`+exp=NAME` (the README's form) as `exp=NAME`: `exp` is in config.yaml's defaults list, so
    that an experiment's text version can follow it there; both spellings mean the same."""
    return [o[1:] if o.startswith("+exp=") else o for o in overrides]


def compose_config(overrides=(), return_hydra_config: bool = False):
    """conf/config.yaml with overrides, as Hydra's DictConfig (with its `hydra` node if asked):
    the one composition run.py makes, text version included."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        cfg = hydra_compose("config", overrides=exp_as_choice(overrides), return_hydra_config=return_hydra_config)
    GlobalHydra.instance().clear()
    return cfg


def compose(overrides=()) -> dict:
    """The resolved plain dict run.py hands to run_experiment."""
    from omegaconf import OmegaConf
    return OmegaConf.to_container(compose_config(overrides), resolve=True)


def experiment_data(exp_name: str) -> str:
    """The data experiment `exp_name` is defined on: what its conf/exp file composes to. Inside a
    Hydra app (run.py) through the app's own config search path, else through conf/."""
    from hydra import compose as hydra_compose
    from hydra.core.global_hydra import GlobalHydra
    if GlobalHydra.instance().is_initialized():
        return hydra_compose("config", overrides=[f"exp={exp_name}"]).data.name
    return compose_config([f"exp={exp_name}"]).data.name
