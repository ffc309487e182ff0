"""The backtest in the report: what `python -m doctor_lab.backtest` committed in
results/backtest/backtest.json (one entry per regression of doctor_lab/backtest/record.yaml: its
verdict, and the doctor's outcome per release x architecture x implementation x check), as a
section of DOCTOR.md, a line for the README (`backtest_summary`) and the page backtest.md. Without
the file, one line says so and how to make it."""
import json
from pathlib import Path

from doctor_lab.report.triage import row_name

NAME = "backtest"
TITLE = "## The backtest: transformers' attention regressions under the doctor"
ANCHOR = "#the-backtest-transformers-attention-regressions-under-the-doctor"
RESULTS = "backtest"   # results/backtest/
COMMAND = "python -m doctor_lab.backtest --pinned DIR"
ROLES = ("before", "introduced", "fixed")
WIDTH = 90   # a cell's words in the tables; backtest.csv has them whole


def load(results: Path) -> dict | None:
    p = Path(results) / RESULTS / "backtest.json"
    return json.loads(p.read_text()) if p.exists() else None


def _cut(text: str, n: int = WIDTH) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= n else text[: n - 1] + "…"


def recall_text(s: dict, word: str = "recall") -> str:
    r = s["recall"]
    return (f"**{word} {r['caught']} of {r['reproducible']}** CPU-reproducible regressions caught "
            f"({r['caught'] + r['imprecise']} counting those caught, imprecise); {r['needs_probe']} of "
            f"{r['entries']} need a probe the doctor lacks")


def summary(s: dict | None) -> str:
    if s is None:
        return f"No backtest committed (results/{RESULTS}/backtest.json is absent): `{COMMAND}` writes it.\n"
    return (f"`{COMMAND}`: the doctor on the releases before, introducing and fixing each regression of "
            f"`{s['record']}`: {recall_text(s)} ([the backtest]({ANCHOR})).\n")


def _cell(c: dict) -> str:
    if not c["outcome"]:   # unsupported: the release lacks the implementation (the zoo's status), else not run
        return _cut(c["not_run"] if c.get("status") == "unsupported" else f"not run: {c['not_run']}", 60)
    m = c["measured"]
    said = ", ".join(x for x in (c["cause"], "" if m is None else f"{m:.3g}" if isinstance(m, float) else str(m)) if x)
    text = c["outcome"] + (f": {c['reason']}" if c["reason"] else "") + (f" ({said})" if said else "")
    return f"**{_cut(text, 60)}**" if c["outcome"] in ("fail", "warn") else _cut(text, 60)


def _details(e: dict) -> list[str]:
    rows, seen = [], {}
    for c in e["cells"]:
        seen.setdefault((row_name(c["arch"], c.get("options", "")), c["impl"], c["check"]), {})[c["role"]] = c
    for (arch, impl, check), by in seen.items():
        rows.append(f"| {e['id']} | {arch}/{impl} | {check} | "
                    + " | ".join(_cell(by[r]) if r in by else "" for r in ROLES) + " |")
    return rows


def render(s: dict | None) -> str:
    if s is None:
        return f"{TITLE}\n\n{summary(None)}"
    last = s.get("last_run") or {}
    lines = [TITLE, "",
             f"`{COMMAND}` takes each regression of `{s['record']}` (the release before it, the release that introduced "
             "it and the one that fixed it, each verified with a standalone repro) and runs the doctor check the entry "
             "names on the entry's architectures x implementations on those releases, each installed in isolation, "
             "through the transformers zoo (`python -m doctor_lab.zoo --release V`: its shrunk random-weight models, "
             "each architecture in its own capped process; an entry of another library through that library's zoo, "
             "its targets the entry's architectures, its paths the implementations: x-transformers' "
             "`python -m doctor_lab.zoo_xt` (einsum for eager, flash for SDPA), diffusers' "
             "`python -m doctor_lab.zoo_diffusers` (self- and cross-attention); an entry marked *option zoo* was judged "
             "on every option set `python -m doctor_lab.zoo --options` found on its releases, its `config:` unused). *caught*: the check fails or warns on the introducing "
             "release and passes on the release before and on the fix (or the architecture lacks the implementation "
             "there: the zoo's `unsupported`); *caught, imprecise*: it fails there too; *caught, unbracketed*: the "
             "release before or the fix gave no row; *missed*: it passes on the introducing release; *not run*: the "
             "doctor had no row there (never counted as caught). An entry whose check is a probe the doctor lacks is missed; the nearest checks the doctor has "
             "run in its place, so that the miss is measured (`--no-nearest` skips them). Every row: "
             f"`results/{RESULTS}/backtest.csv`.", "",
             recall_text(s, "Recall") + "."
             + (f" The last run: {last['wall_s'] / 60:.1f} min wall on {last['cores']} cores ({last['zoo_calls']} zoo calls, "
                f"{last['installs']} releases installed)." if last.get("wall_s") is not None else ""), "",
             "| regression | check | before | introduced | fixed | verdict |", "|---|---|---|---|---|---|"]
    for e in s["entries"]:
        rel = e["releases"]
        check = e["check"] + (" (a probe the doctor lacks)" if e["probe"] else "") + (", option zoo" if e.get("options") else "")
        lib = e.get("library", "transformers")
        lines.append(f"| {e['id']}{'' if lib == 'transformers' else f' ({lib})'} | {check} | " + " | ".join(rel.get(r, "open") for r in ROLES)
                     + f" | **{e['verdict']}**: {_cut(e['text'], 200)} |")
    details = [r for e in s["entries"] for r in _details(e)]
    if details:
        lines += ["", "The doctor's outcome per release (cause, measured value; nearest checks where the entry's check "
                  "is a probe the doctor lacks):", "",
                  "| regression | arch/impl | check | before | introduced | fixed |", "|---|---|---|---|---|---|", *details]
    return "\n".join(lines) + "\n"


def page(s: dict | None) -> str:
    """backtest.md: the section as a page of its own."""
    return render(s)[1:]


def blocks(runs, fig_dir: Path) -> dict[str, str]:
    """The section (`backtest`) and its README line (`backtest_summary`); a line saying how to make
    them where nothing is committed."""
    s = load(Path(fig_dir).parent)
    return {NAME: render(s), "backtest_summary": summary(s)}
