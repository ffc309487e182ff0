"""conf/ composed outside run.py (benchmarks, tests, notebooks), and reading it: conf/ is the one
place a default lives, so code reads keys without fallbacks and a missing one is an error naming it."""
from pathlib import Path

CONF = Path(__file__).resolve().parents[1] / "conf"


def need(section: dict, path: str):
    """section[last part of path]; a missing key is an error naming the dotted `path`, as the
    schema's (experiments.schema checks whole configs in preflight; this guards direct callers)."""
    from experiments.schema import ConfigError
    key = path.rsplit(".", 1)[-1]
    try:
        return section[key]
    except (KeyError, TypeError):
        raise ConfigError(f"{path} is missing from the config") from None


def compose_config(overrides=(), return_hydra_config: bool = False):
    """conf/config.yaml with overrides, as Hydra's DictConfig (with its `hydra` node if asked)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from experiments.on_text import overlay_overrides
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        cfg = hydra_compose("config", overrides=list(overrides), return_hydra_config=return_hydra_config)
        text = overlay_overrides(cfg.exp.name, cfg.data.name, list(overrides))  # its text version
        if text is not None:
            cfg = hydra_compose("config", overrides=text, return_hydra_config=return_hydra_config)
    GlobalHydra.instance().clear()
    return cfg


def compose(overrides=()) -> dict:
    """The resolved plain dict run.py hands to run_experiment."""
    from omegaconf import OmegaConf
    return OmegaConf.to_container(compose_config(overrides), resolve=True)
