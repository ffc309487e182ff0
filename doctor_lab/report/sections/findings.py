"""The findings: every docs/findings/ page a zoo's triage points at (a bug in a third-party library,
with its repro, cause, patch and report), its library and its rows in that zoo's current table.
`python -m doctor_lab.zoo.findings check` runs each repro before and after its patch."""
from collections import Counter
from pathlib import Path

from doctor_lab.report import releases, triage
from doctor_lab.report.sections import zoo, zoo_diffusers, zoo_xt

NAME = "findings"
# (library, its zoo's directory under results/, its triage)
ZOOS = (("transformers", "zoo", triage.TRANSFORMERS), ("x-transformers", "zoo_xt", zoo_xt.TRIAGE),
        ("diffusers", "zoo_diffusers", zoo_diffusers.TRIAGE))


def found(z: dict | None, spec: triage.Spec) -> dict[str, tuple[int, str]]:
    """entry id -> (its rows, its kind: finding, or artifact when every rerun row needs a condition)."""
    if not z:
        return {}
    needs = releases.needs_of(z)
    return {p["key"]: (len(p["rows"]), releases.problem_kind(p, needs))
            for p in triage.problems(spec.table_flags(z), spec.entries()) if p["kind"] == "finding"}


def blocks(runs, fig_dir: Path) -> dict[str, str]:
    rows = []
    for library, results, spec in ZOOS:
        z = zoo.current(Path(fig_dir).parent / results)
        seen = found(z, spec)
        release = f"{library} {triage.release_of(z)}" if z else library
        for e in spec.entries():
            if e["kind"] == "finding":
                n, kind = seen.get(e["id"], (0, "finding"))
                rows.append((f"| [{Path(e['finding']).stem}](../{e['finding']}) | {release} | {n} | "
                             f"{zoo.KIND_NAMES[kind]} |", kind))
    if not rows:
        return {}
    kinds = Counter(kind for _, kind in rows)
    return {NAME: "\n".join([
        "## Findings: bugs in third-party attention\n",
        f"{len(rows)} pages in docs/findings/ ({kinds['finding']} new findings, {kinds['artifact']} that need a "
        "random-init condition), each with a standalone repro (exit 1 while the bug is there), its cause in the "
        "library's source, a patch and the report to file; `python -m doctor_lab.zoo.findings check` runs every "
        "repro before and after its patch. Rows: those of the zoo's current table the page explains (0: none "
        "there now).\n",
        "| finding | zoo (release) | rows | kind |", "|---|---|---|---|", *(row for row, _ in rows)]) + "\n"}
