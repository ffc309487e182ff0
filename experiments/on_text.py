"""Text versions of experiments: one overlay per experiment, applied when the data is text.

    python run.py +exp=no_scaling data=shakespeare_char        # the same failure on text, judged by text signatures
    python run.py -m '+exp=glob(*)' data=shakespeare_char      # the text catalogue

conf/on_text/NAME.yaml (`# @package _global_`) is experiment NAME's text version: the settings text
needs (a smaller model, fewer steps: stated in the file) and its signature on text (exp.expect,
exp.checks, exp.claim). When data.name is a text task (TEXT_TASKS), run.py and
experiments.config.compose compose the config again with `+on_text=NAME` after the command line's
choices: the overlay beats conf/exp/NAME.yaml, and the command line's key=value overrides still
beat the overlay (Hydra applies them after the defaults list). An overlay that runs on some text
tasks only (the mask bugs need padded batches) lists them in `exp.text_data`.

On text, an experiment without an overlay is rejected: one line naming the data it needs, exit 2;
in a multirun that cell is skipped (skipped.txt, listed at the sweep's end), not failed. A check whose metric the run never
logged is "not measurable on this data" (judging.verdict), never a FAIL.
"""
from pathlib import Path

import yaml

CONF = Path(__file__).resolve().parents[1] / "conf"
TEXT_TASKS = ("shakespeare_char", "shakespeare_lines")  # shakespeare_lines: one padded line per example
GROUP = "on_text"
SKIPPED = "skipped.txt"  # a cell of a multirun on text with no text version: its one line (not a crash)


class NoTextVersion(ValueError):
    """This experiment does not run on this text task (exit 2; in a multirun, a skipped cell)."""


def is_text(data_name: str) -> bool:
    return data_name in TEXT_TASKS


def on_text(run) -> bool:
    """A RunRecord trained on text (the report keeps text versions apart from the synthetic runs)."""
    return is_text(((run.config or {}).get("data") or {}).get("name"))


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
    if not is_text(data_name) or any(o.lstrip("+~").split("=")[0] == GROUP for o in overrides):
        return None
    if not (CONF / GROUP / f"{exp_name}.yaml").exists():
        raise NoTextVersion(f"{exp_name} has no text version (conf/{GROUP}/{exp_name}.yaml): "
                         f"it runs on data={synthetic_data(exp_name)}, not on {data_name}")
    return [*overrides, f"+{GROUP}={exp_name}"]


def check_text_data(cfg: dict) -> None:
    """An overlay that runs on some text tasks only: any other data is rejected, naming those."""
    exp, data = cfg["exp"], cfg["data"]["name"]
    allowed = exp["text_data"]
    if is_text(data) and allowed and data not in allowed:
        raise NoTextVersion(f"{exp['name']} on text needs data={' or '.join(allowed)}, not {data}")
