"""Greedy samples on text (`exp.measures: ["greedy_sample"]`, e.g. head_merge_no_transpose
with data=shakespeare_char): per experiment, the failure's and its control's loss as trained
(teacher-forced) and as generation meets it (each character from its prefix alone), how garbled
the greedy sample is, and the samples themselves."""
import math
from pathlib import Path

from experiments.on_text import CORPUS_NAMES, corpus
from experiments.records import RunRecord
from experiments.report.runs import control_name

NAME = "text_samples"
TEXT = True  # build.render_blocks: text runs reach this section
KEYS = ("loss/train", "gen/prefix_loss", "gen/gap", "sample/trigram_nll", "sample/repeat_frac")


def _f(x) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def _sample(text: str) -> list[str]:
    return ["```text", text.replace("```", "'''"), "```"]


def _corpus_block(exp: str, mine: list[RunRecord], name: str | None, named: bool) -> list[str]:
    """One corpus's runs of one experiment: the real text's yardstick, the table, the lowest seed's samples."""
    real = mine[0].final
    tasks = sorted({r.config["data"]["name"] for r in mine if r.config})
    where = f"**{CORPUS_NAMES.get(name, name)}** (`data={'`, `data='.join(tasks)}`): " if named and name else ""
    lines = [f"{where}{'the' if where else 'The'} text that really follows the prompt: trigram loss "
             f"{_f(real.get('sample/real_trigram_nll'))}, repeated 4-grams {_f(real.get('sample/real_repeat_frac'))}.", "",
             "| seed | run | val loss | loss from the prefix alone | gap | sample's trigram loss "
             "| repeated 4-grams |", "|---|---|---|---|---|---|---|"]
    for r in mine:
        for x, role in ((r, exp), (r.control_run, (r.control or {}).get("name", "control"))):
            if x is None or x.status != "completed":
                continue
            f = x.final
            lines.append(f"| {r.seed} | {role} | " + " | ".join(_f(f.get(k)) for k in KEYS) + " |")
    first = mine[0]
    lines += ["", f"Seed {first.seed}, the prompt:", *_sample(first.final["sample/prompt"]),
              f"{exp}'s greedy continuation:", *_sample(first.final["sample/greedy"])]
    ctrl = first.control_run
    if ctrl is not None and "sample/greedy" in (ctrl.final or {}):
        lines += [f"its control's ({control_name(first)}):", *_sample(ctrl.final["sample/greedy"])]
    return lines + [""]


def render(runs: list[RunRecord], fig_dir: Path) -> str | None:
    fails = sorted((r for r in runs if not r.is_control and "sample/greedy" in (r.final or {})),
                   key=lambda r: (r.exp, r.seed or 0, r.id))
    if not fails:
        return None
    lines = ["## Greedy samples on text", "",
             "Per run: the validation loss as trained (teacher-forced, every position in one forward); the loss "
             "on 16 validation rows with each target predicted from its prefix alone, as generation predicts it, "
             "and its gap to the teacher-forced loss on the same rows (0 for a causal model; a model that reads "
             "later positions gains in the first and loses in the second); then "
             "the greedy sample after a fixed prompt from the val split: its loss in nats per character under a "
             "character trigram model of the training split (the same yardstick for every run; real text ~2, "
             "but a loop of common words scores low too) and its share of repeated 4-grams (real text ~0.15, "
             "a loop near 1).", ""]
    for exp in sorted({r.exp for r in fails}):
        lines += [f"### {exp} on text: greedy samples", ""]
        mine = [r for r in fails if r.exp == exp]
        groups = [c for c in (*CORPUS_NAMES, None) if any(corpus(r) == c for r in mine)]
        for c in groups:  # each corpus its own table and prompt: seeds of two corpora are not one run's
            lines += _corpus_block(exp, [r for r in mine if corpus(r) == c], c, len(groups) > 1 or c is not None)
    return "\n".join(lines).rstrip()
