"""Text versions of experiments. On text data (TEXT_TASKS) conf/config.yaml's defaults list adds,
after the experiment, `text: DATA`: conf/text/DATA.yaml, what every text version shares (the text
model conf/text_lm/char.yaml, whose keys beat the experiment's; the no-attention floor), followed
by the experiment's own text version conf/on_text/EXP.yaml (an optional config: the settings its bug
needs beyond the text model, and the signature the experiment has on text). One composition gives
the config that trains, and the run dir's .hydra/config.yaml records exactly that; key=value on
the command line still wins.

    python run.py +exp=no_scaling data=shakespeare_char        # the same failure on text, judged by text signatures
    python run.py -m '+exp=glob(*)' data=shakespeare_char      # the text catalogue

On text, an experiment runs if it has a text version that allows this task (`exp.text_data`: the
tasks it runs on, null for every one) or if this is its own data; else it is rejected: one line
naming the data it runs on, exit 2; in a multirun that cell is skipped (layout.SKIPPED, listed at
the sweep's end), not failed. A check whose metric the run never logged is "not measurable on this
data" (judging.verdict), never a FAIL.
"""
from pathlib import Path

import yaml

CONF = Path(__file__).resolve().parents[1] / "conf"
# text task -> its corpus. *_lines: one padded line per example. Thresholds are set on Shakespeare;
# the Python source and Chichewa (data/text.py) only check that each signature holds on other text.
CORPUS = {"shakespeare_char": "shakespeare", "shakespeare_lines": "shakespeare",
          "python_source_char": "python_source", "python_source_lines": "python_source",
          "chichewa_char": "chichewa", "chichewa_lines": "chichewa"}
TEXT_TASKS = tuple(CORPUS)
REFERENCE_CORPUS = "shakespeare"
# each corpus as the report names it, in the report's order (the reference first)
CORPUS_NAMES = {"shakespeare": "tiny Shakespeare", "python_source": "Python source", "chichewa": "Chichewa"}


class NoTextVersion(ValueError):
    """This experiment does not run on this text task (exit 2; in a multirun, a skipped cell)."""


def is_text(data_name: str) -> bool:
    return data_name in TEXT_TASKS


def run_data(run) -> str | None:
    """The data a RunRecord trained on."""
    return ((run.config or {}).get("data") or {}).get("name")


def on_text(run) -> bool:
    """A RunRecord trained on text (the report keeps text versions apart from the synthetic runs)."""
    return is_text(run_data(run))


def corpus(run) -> str | None:
    """The corpus a text run trained on (CORPUS); None for a synthetic run."""
    return CORPUS.get(run_data(run))


def has_text_version(exp_name: str) -> bool:
    return (CONF / "on_text" / f"{exp_name}.yaml").is_file()


def no_text_reason(exp_name: str) -> str | None:
    """Why an experiment has no text version: `exp.no_text_version` in conf/exp/NAME.yaml."""
    conf = CONF / "exp" / f"{exp_name}.yaml"
    spec = ((yaml.safe_load(conf.read_text()) or {}).get("exp") or {}) if conf.is_file() else {}
    return spec.get("no_text_version")


def reject_without_text_version(cfg: dict, own_data) -> None:
    """NoTextVersion (one line) when the config's data is text and the experiment runs on neither
    it (a text version whose exp.text_data allows it) nor has it as its own data (`own_data()`: the
    data its conf/exp file composes)."""
    spec, data = cfg["exp"], cfg["data"]["name"]
    if not is_text(data):
        return
    allowed = spec["text_data"]
    if has_text_version(spec["name"]) and (not allowed or data in allowed):
        return
    own = own_data()
    if own == data:
        return
    if has_text_version(spec["name"]):
        raise NoTextVersion(f"{spec['name']} on text needs data={' or '.join(allowed)}, not {data}")
    why = f" ({spec['no_text_version']})" if spec["no_text_version"] else ""
    raise NoTextVersion(f"{spec['name']} has no text version{why}: it runs on data={own}, not on {data}")
