"""Text versions of experiments: one overlay per experiment, applied when the data is text.

    python run.py +exp=no_scaling data=shakespeare_char        # the same failure on text, judged by text signatures
    python run.py -m '+exp=glob(*)' data=shakespeare_char      # the text catalogue

conf/text_lm/char.yaml (`# @package _global_`) is the text model every text version shares: the
model, optimizer and length on text, and the no-attention floor, declared once. conf/on_text/NAME.yaml
(`# @package _global_`) is experiment NAME's text version: what its bug needs beyond the text model
(a setting it cannot do without, stated in the file) and its signature on text (exp.expect,
exp.checks, exp.claim). When data.name is a text task (TEXT_TASKS), run.py and
experiments.config.compose compose the config again with `+text_lm=char +on_text=NAME` after the
command line's choices: the text model beats conf/exp/NAME.yaml, the overlay beats both, and the
command line's key=value overrides still beat the overlay (Hydra applies them after the defaults
list); `+text_lm=none` keeps the command line's model (conf/text_lm/none.yaml: the floor alone). Every text version whose control is the text model with its bug fixed shares one control
and one floor per seed and corpus (cached by config). An overlay that runs on some text tasks only
(the mask bugs need padded batches) lists them in `exp.text_data`. An experiment with no text
version says why in `exp.no_text_version` (conf/exp/NAME.yaml; the report's text table shows it).

On text, an experiment without an overlay is rejected: one line naming the data it needs, exit 2;
in a multirun that cell is skipped (skipped.txt, listed at the sweep's end), not failed. A check whose metric the run never
logged is "not measurable on this data" (judging.verdict), never a FAIL.
"""
from pathlib import Path

import yaml

CONF = Path(__file__).resolve().parents[1] / "conf"
# text task -> its corpus. *_lines: one padded line per example. Thresholds are set on Shakespeare;
# the Python source (data/text.py) only checks that each signature holds on another kind of text.
CORPUS = {"shakespeare_char": "shakespeare", "shakespeare_lines": "shakespeare",
          "python_source_char": "python_source", "python_source_lines": "python_source"}
TEXT_TASKS = tuple(CORPUS)
REFERENCE_CORPUS = "shakespeare"
GROUP = "on_text"
TEXT_LM = "text_lm"  # the shared text model: conf/text_lm/char.yaml, composed before the overlay;
# `+text_lm=none` on the command line keeps the command line's model (a preset such as nanogpt_cpu)
SKIPPED = "skipped.txt"  # a cell of a multirun on text with no text version: its one line (not a crash)


class NoTextVersion(ValueError):
    """This experiment does not run on this text task (exit 2; in a multirun, a skipped cell)."""


def is_text(data_name: str) -> bool:
    return data_name in TEXT_TASKS


def run_data(run) -> str | None:
    return ((run.config or {}).get("data") or {}).get("name")


def on_text(run) -> bool:
    """A RunRecord trained on text (the report keeps text versions apart from the synthetic runs)."""
    return is_text(run_data(run))


def corpus(run) -> str | None:
    """The corpus a text run trained on (CORPUS); None for a synthetic run."""
    return CORPUS.get(run_data(run))


def _exp_file(exp_name: str) -> dict:
    conf = CONF / "exp" / f"{exp_name}.yaml"
    return (yaml.safe_load(conf.read_text()) or {}) if conf.exists() else {}


def no_text_reason(exp_name: str) -> str | None:
    """Why an experiment has no text version: `exp.no_text_version` in conf/exp/NAME.yaml."""
    return (_exp_file(exp_name).get("exp") or {}).get("no_text_version")


def synthetic_data(exp_name: str) -> str:
    """The data an experiment is defined on: its file's `override /data`, else config.yaml's."""
    for conf in (CONF / "exp" / f"{exp_name}.yaml", CONF / "config.yaml"):
        if conf.exists():
            for entry in (yaml.safe_load(conf.read_text()) or {}).get("defaults") or []:
                if isinstance(entry, dict):
                    for k, v in entry.items():
                        if k.split()[-1].strip("/") == "data":
                            return v
    return "copy"


def overlay_overrides(exp_name: str, data_name: str, overrides: list[str]) -> list[str] | None:
    """The overrides that compose experiment `exp_name`'s text version, or None when the data is
    not text (or the command line chose an overlay itself). ValueError (one line) when the
    experiment has no text version."""
    groups = {o.lstrip("+~").split("=")[0] for o in overrides}
    if not is_text(data_name) or GROUP in groups:
        return None
    if not (CONF / GROUP / f"{exp_name}.yaml").exists():
        why = no_text_reason(exp_name)
        raise NoTextVersion(f"{exp_name} has no text version (conf/{GROUP}/{exp_name}.yaml)"
                            f"{': ' + why if why else ''}; it runs on data={synthetic_data(exp_name)}, "
                            f"not on {data_name}")
    text_lm = [] if TEXT_LM in groups else [f"+{TEXT_LM}=char"]
    return [*overrides, *text_lm, f"+{GROUP}={exp_name}"]


def check_text_data(cfg: dict) -> None:
    """An overlay that runs on some text tasks only: any other data is rejected, naming those."""
    exp, data = cfg["exp"], cfg["data"]["name"]
    allowed = exp["text_data"]
    if is_text(data) and allowed and data not in allowed:
        raise NoTextVersion(f"{exp['name']} on text needs data={' or '.join(allowed)}, not {data}")
