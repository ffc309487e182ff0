"""A result in the forms CI shows (the command's --format): text, the fixed-width table of
DoctorResult.table(); markdown, the table a pull request comment shows; github, one workflow
annotation per check that stops the gate (GitHub Actions' `::error` lines, `::warning` for a warn
row and for an expected failure that did not happen), then the text table for the log. The cells
are the table's own (DoctorResult.cells). Torch-free."""
from attention_doctor.result import DoctorResult

FORMATS = ("text", "markdown", "github")


def _md(cell) -> str:
    return str(cell).replace("|", "\\|")


def markdown(result: DoctorResult) -> str:
    """The table as GitHub-flavoured markdown: a heading line, the rows, the notes as a numbered
    list, the summary."""
    head, body, notes = result.cells()
    out = [f"**{_md(result.header())}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cells in body:
        name, outcome, cause, *rest = cells
        outcome = f"**{outcome}**" if outcome in ("fail", "inconclusive") else outcome
        out.append("| " + " | ".join(_md(c) for c in [f"`{name}`", outcome, f"`{cause}`" if cause != "-" else "-",
                                                          *rest]) + " |")
    out += [""] + [f"{i}. {_md(n)}" for i, n in enumerate(notes, 1)]
    out += [""] + [f"**{line}**" if i == 0 else line for i, line in enumerate(result.summary().splitlines())]
    return "\n".join(out)


def _escape(text: str, prop: bool = False) -> str:
    """GitHub's workflow-command escaping (data: %, CR, LF; a property also : and ,)."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def github(result: DoctorResult) -> str:
    """One annotation per check that stops the gate (a fail, or an inconclusive, that the baseline
    does not expect: `::error`), `::warning` for a warn row and an expected failure that did not
    happen; then the text table."""
    judged = {j.row.name: j for j in result.judged()}
    out = []
    for r in result.checks:
        j = judged.get(r.name)
        status = j.status.value if j is not None else {"fail": "unexpected", "inconclusive": "inconclusive"}.get(
            r.outcome.value, "ok")
        said = j.message() if j is not None else r.name + f": {r.outcome.value}" + (f" ({r.cause})" if r.cause else "")
        if status in ("unexpected", "inconclusive"):
            level = "error"
        elif status == "fixed" or r.outcome.value == "warn":
            level = "warning"
        else:
            continue
        title = _escape(f"attention doctor: {r.name}", prop=True)
        out.append(f"::{level} title={title}::{_escape(said + (f' -- {r.detail}' if r.detail else ''))}")
    return "\n".join(out + [result.table()])


def render(result: DoctorResult, fmt: str = "text") -> str:
    """The result in format `fmt` (FORMATS)."""
    if fmt == "markdown":
        return markdown(result)
    if fmt == "github":
        return github(result)
    return result.table()
