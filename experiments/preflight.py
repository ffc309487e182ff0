"""Checks that must happen before Hydra starts: an unknown config option (`+exp=typo`,
`optim=adam`), a results dir that cannot be written, or a sweep preset run without -m ends with
one line and exit 2, instead of Hydra's traceback and exit 1 (or one arbitrary cell of a sweep)."""
import os
import re
import sys
import tempfile
from pathlib import Path

import yaml


def _fail(msg: str):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def _options(value: str) -> list[str]:
    m = re.fullmatch(r"(?:choice|glob)\((.*)\)", value)
    if value.startswith("glob("):
        return []  # a pattern: Hydra expands it against what exists
    return [v.strip() for v in (m.group(1) if m else value).split(",") if v.strip()]


def check_argv(argv: list[str], conf_dir: Path) -> None:
    results_dir = "results"
    if not {"-m", "--multirun"} & set(argv):
        check_single_run(argv, conf_dir)
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~")
        if key == "results_dir":
            results_dir = value
        group = conf_dir / key
        if "." in key or "/" in key or not group.is_dir():
            continue
        known = sorted(p.stem for p in group.glob("*.yaml"))
        for opt in _options(value):
            if opt not in known and opt != "null":
                _fail(f"unknown {key} {opt!r}; known: {', '.join(known)}")
    try:
        Path(results_dir).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=results_dir):
            pass
    except OSError as e:
        _fail(f"results_dir={results_dir!r} cannot be written: {e.strerror or e}")
    if not os.access(results_dir, os.W_OK):
        _fail(f"results_dir={results_dir!r} cannot be written")


# -- sweep presets --------------------------------------------------------------------------
# An exp file that carries `hydra.sweeper.params` is a sweep preset (`-m +exp=phase_no_scaling`
# sweeps its own grid). Its grid only applies when it is the one exp of a multirun, so inside
# `+exp=glob(*)` it would train one arbitrary cell under the preset's name: the catalogue
# leaves presets out, before Hydra expands the glob, and launches no job for them.

def swept_keys(conf_dir: Path) -> dict[str, list[str]]:
    """{preset name: the keys its grid sweeps}."""
    out = {}
    for f in sorted((Path(conf_dir) / "exp").glob("*.yaml")):
        d = yaml.safe_load(f.read_text()) or {}
        params = ((d.get("hydra") or {}).get("sweeper") or {}).get("params")
        if params:
            out[f.stem] = list(params)
    return out


def sweep_presets(conf_dir: Path) -> list[str]:
    return list(swept_keys(conf_dir))


def check_single_run(argv: list[str], conf_dir: Path) -> None:
    """A preset run without -m would train one arbitrary cell under the preset's name: it is one
    run only when the command line pins every key the grid sweeps (the seed aside)."""
    args = dict(a.lstrip("+~").split("=", 1) for a in argv if "=" in a and not a.startswith("-"))
    keys = swept_keys(conf_dir).get(args.get("exp", ""))
    if keys is None:
        return
    unpinned = [k for k in keys if k != "seed" and k not in args]
    if unpinned:
        name = args["exp"]
        _fail(f"{name} is a sweep: python run.py -m +exp={name} (one cell: pin {', '.join(unpinned)})")


def exclude_sweep_presets(argv: list[str], conf_dir: Path) -> list[str]:
    """`exp=glob(PATTERN)` -> `exp=glob(PATTERN,exclude=[presets])`; an explicit exclude is kept."""
    presets = sweep_presets(conf_dir)
    out = []
    for arg in argv:
        key, _, value = arg.partition("=")
        m = re.fullmatch(r"glob\((.*)\)", value.strip())
        if key.lstrip("+~") == "exp" and m and "exclude" not in m.group(1) and presets:
            arg = f"{key}=glob({m.group(1)},exclude=[{','.join(presets)}])"
        out.append(arg)
    return out

