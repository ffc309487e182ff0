"""Text versions of experiments. On text data (TEXT_TASKS) conf/config.yaml's defaults list adds,
after the experiment, `text: DATA` (conf/text/DATA.yaml: what every text version shares, the
no-attention floor) and `on_text: DATA/EXP` (conf/on_text/DATA/EXP.yaml: experiment EXP's settings
and signature on that text), so one composition gives the config that trains and its run dir's
.hydra/config.yaml records exactly that; key=value on the command line still wins.

    python run.py +exp=no_scaling data=shakespeare_char        # the same failure on text, judged by text signatures
    python run.py -m '+exp=glob(*)' data=shakespeare_char      # the text catalogue

On text, an experiment with neither a text version there nor that data of its own is rejected:
one line naming the data it runs on, exit 2; in a multirun that cell is skipped (layout.SKIPPED,
listed at the sweep's end), not failed. A check whose metric the run never logged is "not
measurable on this data" (judging.verdict), never a FAIL.
"""
from pathlib import Path

CONF = Path(__file__).resolve().parents[1] / "conf"
TEXT_TASKS = ("shakespeare_char", "shakespeare_lines")  # shakespeare_lines: one padded line per example


class NoTextVersion(ValueError):
    """This experiment does not run on this text task (exit 2; in a multirun, a skipped cell)."""


def is_text(data_name: str) -> bool:
    return data_name in TEXT_TASKS


def on_text(run) -> bool:
    """A RunRecord trained on text (the report keeps text versions apart from the synthetic runs)."""
    return is_text(((run.config or {}).get("data") or {}).get("name"))


def text_versions(exp_name: str) -> list[str]:
    """The text tasks experiment `exp_name` has a version for (conf/on_text/DATA/EXP.yaml)."""
    return sorted(p.parent.name for p in (CONF / "on_text").glob(f"*/{exp_name}.yaml"))


def reject_without_text_version(exp_name: str, data_name: str, own_data) -> None:
    """NoTextVersion (one line) when `data_name` is text, the experiment has no version for it and
    it is not the experiment's own data (`own_data()`: the data its conf/exp file composes)."""
    if not is_text(data_name) or data_name in text_versions(exp_name):
        return
    own = own_data()
    if own != data_name:
        runs_on = " or ".join(dict.fromkeys([own, *text_versions(exp_name)]))
        raise NoTextVersion(f"{exp_name} has no text version on {data_name} "
                            f"(conf/on_text/{data_name}/{exp_name}.yaml): it runs on data={runs_on}")
