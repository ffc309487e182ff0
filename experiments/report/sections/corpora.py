"""Each text signature on each corpus: per text version its rate and every gating check at its
worst seed, the threshold as its config writes it (in the corpus's own units: `gain`, attention's
gain there, the floor minus the healthy text model; `floor`; `control`) beside the number it took
on that corpus, and attention's gain itself. The thresholds were set on Shakespeare; a corpus where a
version does not reproduce is a finding (docs/conditions.md)."""
from pathlib import Path

from experiments.on_text import CORPUS_NAMES, REFERENCE_CORPUS, corpus
from experiments.records import RunRecord
from experiments.report.runs import text_version
from experiments.report.seeds import Rate, held_to

NAME = "corpora"
TITLE = "## The text signatures on each corpus"   # refresh() puts a new section before it
TEXT = True


def _num(x) -> str:
    return "–" if x is None else f"{x:.3g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def _distance(c: dict) -> float:
    """How far a check's measured value lies on its passing side of the threshold (negative: failed)."""
    t = held_to(c)
    m = c.get("measured")
    if t is None or not isinstance(m, (int, float)) or isinstance(m, bool):
        return 0.0 if c.get("passed") else -1.0
    op, limit = t
    return (m - limit) if op in (">=", ">") else (limit - m)


def worst_checks(runs: list[RunRecord]) -> list[str]:
    """Every gating check of the runs' verdicts at its worst seed: `key measured (op threshold =
    rule; seed s)`, FAIL where it failed there."""
    out = []
    keys = [c["key"] for c in next((r.verdict["checks"] for r in runs if (r.verdict or {}).get("checks")), [])
            if not c.get("report_only")]
    for key in keys:
        seen = [(c, r.seed) for r in runs for c in (r.verdict or {}).get("checks", []) if c.get("key") == key]
        if not seen:
            continue
        c, seed = min(seen, key=lambda cs: _distance(cs[0]))
        if c.get("not_measurable"):
            out.append(f"{key}: not measurable")
            continue
        held = "" if c.get("op") is None else f" ({c['op']} {_num(c['threshold'])}" + (
            f" = {c['rule']}" if c.get("rule") and c.get("kind") != "status" else "") + f"; seed {seed})"
        out.append(f"{key} {_num(c['measured'])}{held}" + ("" if c.get("passed") else " **FAIL**"))
    return out


def _gain(runs: list[RunRecord]) -> str:
    """Attention's gain on the corpus (the floor minus the text model), per seed, where measured."""
    by_seed = {}
    for r in runs:
        if "gain" in (r.context or {}):
            by_seed.setdefault(r.seed, r.context["gain"])
    return ", ".join(f"{g:.3f}" for _, g in sorted(by_seed.items())) or "–"


def _corpus_block(name: str, runs: list[RunRecord]) -> list[str]:
    exps = sorted({r.exp for r in runs})
    rates = {e: Rate.of([r for r in runs if r.exp == e]) for e in exps}
    every = sum(rates[e].k == rates[e].n for e in exps)
    seeds = sorted({r.seed for r in runs})
    tasks = sorted({r.config["data"]["name"] for r in runs})
    rows = ["| text version | reproduced | every gating check at its worst seed: measured (threshold = as written) |",
            "|---|---|---|"]
    for e in exps:
        mine = sorted((r for r in runs if r.exp == e), key=lambda r: r.seed or 0)
        rows.append(f"| {e} | {rates[e].k} of {rates[e].n} | {'; '.join(worst_checks(mine)) or '–'} |")
    where = "where the thresholds were set" if name == REFERENCE_CORPUS else "thresholds not set here"
    return [f"### {CORPUS_NAMES.get(name, name)}", "",
            f"`data={'`, `data='.join(tasks)}` ({where}), seeds {', '.join(map(str, seeds))}: **{every} of "
            f"{len(exps)} text versions reproduce in every seed**. Attention's gain there (`gain`: the floor "
            f"minus the healthy text model, nats per character, per seed on windows): {_gain(runs)}.", "",
            *rows, ""]


def render(runs: list[RunRecord], fig_dir: Path) -> str | None:
    text = [r for r in runs if text_version(r) and not r.is_control and r.verdict]
    present = [c for c in CORPUS_NAMES if any(corpus(r) == c for r in text)]
    if not present:
        return None
    out = [TITLE, "",
           "Each text version's signature on each corpus that ran it: every gating check at the seed where it "
           "lies closest to its threshold, with the threshold as its config (`conf/on_text/`) writes it and the "
           "number it took on that corpus. A threshold on a loss is written in the corpus's own units: `gain` "
           "(attention's gain on the corpus and seed: the no-attention floor minus the healthy text model), "
           "`floor`, `control`; never in nats, which say more about a corpus than about a bug "
           "(tests/test_corpus_units.py holds every one to that). Where a version does not reproduce on a corpus, "
           "docs/conditions.md says why.", ""]
    for c in present:
        out += _corpus_block(c, [r for r in text if corpus(r) == c])
    return "\n".join(out)
