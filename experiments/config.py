"""conf/ composed outside run.py (benchmarks, tests, notebooks), and reading it: conf/ is the one
place a default lives, so code reads keys without fallbacks and a missing one is an error naming it."""
from pathlib import Path

from attention.config import show
from experiments.schema import ConfigError, get, leaves

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
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
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


def exp_check(name: str, check: str) -> dict:
    """A check as conf/exp/NAME.yaml declares it (plain YAML, no composition): for a report section
    that applies an experiment's rule to other runs (the phase diagram: no_scaling's plateau)."""
    import yaml
    return yaml.safe_load((CONF / "exp" / f"{name}.yaml").read_text())["exp"]["checks"][check]


def experiment_data(exp_name: str) -> str:
    """The data experiment `exp_name` is defined on: what its conf/exp file composes to. Inside a
    Hydra app (run.py) through the app's own config search path, else through conf/."""
    from hydra import compose as hydra_compose
    from hydra.core.global_hydra import GlobalHydra
    if GlobalHydra.instance().is_initialized():
        return hydra_compose("config", overrides=[f"exp={exp_name}"]).data.name
    return compose_config([f"exp={exp_name}"]).data.name


# The groups whose keys the text model (conf/text_lm/char.yaml, composed on text data after the
# experiment) sets: a choice of one of them on the command line keeps only the keys it does not set.
TEXT_MODEL_GROUPS = ("model", "optim", "train")


def _compose_here(overrides) -> dict:
    """compose(), or inside a Hydra app (run.py) through the app's own config search path."""
    from hydra import compose as hydra_compose
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf
    if GlobalHydra.instance().is_initialized():
        return OmegaConf.to_container(hydra_compose("config", overrides=list(overrides)), resolve=True)
    return compose(overrides)


def replaced_by_text_model(overrides, cfg: dict) -> str | None:
    """The keys of a group chosen on the command line (model=nanogpt_cpu) that the text model
    replaced in `cfg`, the config composed from `overrides`, as one line; None if it replaced
    none. Read by composing the same command line with text_lm=none, which keeps the choice."""
    chosen = [o for o in overrides if o.split("=", 1)[0] in TEXT_MODEL_GROUPS]
    text_model = (CONF / "text" / f"{cfg['data']['name']}.yaml").exists() and "text_lm=none" not in overrides
    if not chosen or not text_model:  # conf/text/DATA.yaml composes the text model (config.yaml's defaults)
        return None
    kept = _compose_here([*overrides, "text_lm=none"])
    changed = [f"{key}={show(get(kept, key))} -> {show(get(cfg, key))}"
               for group in (o.split("=", 1)[0] for o in chosen) for key in leaves(cfg[group], f"{group}.")
               if get(kept, key) != get(cfg, key)]
    if not changed:
        return None
    return (f"note: on text data the text model (conf/text_lm/char.yaml) replaced what {', '.join(chosen)} set: "
            f"{', '.join(changed)}; add text_lm=none to train your choice")
