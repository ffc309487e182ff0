"""Checks that must happen before Hydra starts: an unknown config option (`+exp=typo`,
`optim=adam`), a results dir that cannot be written, or a sweep preset run without -m ends with
one line and exit 2, instead of Hydra's traceback and exit 1 (or one arbitrary cell of a sweep)."""
import os
import re
import sys
import tempfile
from pathlib import Path

import yaml

from experiments.suggest import closest


def _fail(msg: str):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def _options(value: str) -> list[str]:
    m = re.fullmatch(r"(?:choice|glob)\((.*)\)", value)
    if value.startswith("glob("):
        return []  # a pattern: Hydra expands it against what exists
    return [v.strip() for v in (m.group(1) if m else value).split(",") if v.strip()]


def check_argv(argv: list[str], conf_dir: Path) -> Path:
    """Exits 2 with one line on a bad option; returns the results dir."""
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
                near = closest(opt, known)
                _fail(f"unknown {key} {opt!r}: did you mean {' or '.join(near)}?" if near else
                      f"unknown {key} {opt!r}; known: {', '.join(known)}")
    try:
        Path(results_dir).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=results_dir):
            pass
    except OSError as e:
        _fail(f"results_dir={results_dir!r} cannot be written: {e.strerror or e}")
    if not os.access(results_dir, os.W_OK):
        _fail(f"results_dir={results_dir!r} cannot be written")
    return Path(results_dir)


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



# -- Hydra's own errors ----------------------------------------------------------------------
# Hydra rejects an override of a key the config lacks (`train.step=100`) with several lines whose
# advice (`+train.step=100`) would add a key nobody reads. run.py lets Hydra's errors reach it
# whole (HYDRA_FULL_ERROR=1) and says them in one line.

def check_names(conf_dir: Path) -> set[str]:
    """exp.checks.NAME for every check any config defines."""
    names = set()
    for f in [conf_dir / "config.yaml", *sorted((conf_dir / "exp").glob("*.yaml")),
              *sorted((conf_dir / "on_text").glob("*.yaml"))]:
        exp = (yaml.safe_load(f.read_text()) or {}).get("exp") or {}
        names.update(f"exp.checks.{n}" for n in exp.get("checks") or {})
    return names


def hydra_error_line(e: Exception, conf_dir: Path) -> str:
    """One line for a Hydra composition or override error."""
    from experiments.judging.checks import FIELDS
    from experiments.schema import CONTROL_FIELDS, EXP_FIELDS, every_key
    from experiments.suggest import did_you_mean
    m = re.match(r"Could not (?:override|append to|delete from config\. No match in the defaults list for) '?([\w./]+)'?",
                 str(e))
    if not m:
        return (str(e).strip().splitlines() or [type(e).__name__])[0]
    key = m.group(1)
    schema = every_key()
    if key in schema:
        return f"{key} is not a key of the chosen {key.split('.')[0]} (docs/config.md lists each choice's keys)"
    checks = check_names(conf_dir)
    known = schema | {f"exp.{f}" for f in EXP_FIELDS} | {f"exp.{n}.{f}" for n in ("control", "floor")
                                                        for f in CONTROL_FIELDS}
    known |= checks | {f"{c}.{f}" for c in checks for f in FIELDS}
    return f"{key} is not a config key{did_you_mean(key, known)}"


def remove_empty_sweeps(results_dir: Path, since: float) -> None:
    """A multirun Hydra rejected wrote its sweep dir (multirun.yaml only) first: it goes."""
    for d in Path(results_dir).glob("multirun/*"):
        if d.is_dir() and d.stat().st_mtime >= since and {p.name for p in d.iterdir()} <= {"multirun.yaml"}:
            for p in d.iterdir():
                p.unlink()
            d.rmdir()
    d = Path(results_dir) / "multirun"
    if d.is_dir() and not any(d.iterdir()):
        d.rmdir()
