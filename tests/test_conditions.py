"""docs/conditions.md quotes the committed reference only through links to its report section,
`[8.65, 8.38, 8.77](../results/REPORT.md#causal_kv_cache)`, and each number so quoted is that
section's (or that experiment's rows' in the report's tables), to the digits it is quoted with
(issue 35). Numbers measured by hand apart from the reference say so on the page."""
import math
import re

import pytest

from conftest import ROOT

DOC = ROOT / "docs" / "conditions.md"
REPORT = ROOT / "results" / "REPORT.md"
LINK = re.compile(r"\[([^\]]*\d[^\]]*)\]\(\.\./results/REPORT\.md#([\w-]+)\)")
NUMBER = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)(%?)")
HEADING = re.compile(r"^(#+) (.*)$", re.M)


def slug(title: str) -> str:
    """A heading's anchor, as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def scope(report: str, anchor: str) -> str:
    """The report's section with that anchor, and every table row of the experiment it names."""
    heads = list(HEADING.finditer(report))
    for i, h in enumerate(heads):
        if slug(h.group(2)) == anchor:
            level = len(h.group(1))
            end = next((x.start() for x in heads[i + 1:] if len(x.group(1)) <= level), len(report))
            rows = [l for l in report.splitlines() if l.startswith(f"| {anchor} |") or l.startswith(f"| [{anchor}]")]
            return report[h.start():end] + "\n" + "\n".join(rows)
    raise AssertionError(f"REPORT.md has no section #{anchor}")


def half_unit(text: str) -> float:
    """Half a unit of the last digit a number is written with (0.0150: 0.00005; 6.4e3: 50)."""
    mantissa, _, exp = text.lower().lstrip("-").partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** (int(exp or 0) - decimals)


def printed_unit(text: str) -> float:
    """Half a unit of the last digit the report printed; as %g drops trailing zeros, a number
    printed with fewer than 3 significant digits is taken to 3 of them (0.047 is 0.0470), and a 0 is 0."""
    x = abs(float(text))
    return 0.0 if x == 0 else min(half_unit(text), 0.5 * 10.0 ** (math.floor(math.log10(x)) - 2))


def quoted_from(value: str, percent: str, pool: list[str]) -> bool:
    """Whether some number the report prints is `value` as quoted: equal within the rounding of the
    two (the report's 0.04705 is the page's 0.0470 or 0.0471; 2.35e+03 is 2.3e3 or 2.4e3)."""
    scale = 0.01 if percent else 1
    v, tol = float(value) * scale, half_unit(value) * scale
    return any(abs(float(x) - v) <= (tol + printed_unit(x)) * (1 + 1e-9) for x in pool)


def unquoted(text: str, section: str) -> list[str]:
    pool = re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", section)
    return [v + p for v, p in NUMBER.findall(text) if not quoted_from(v, p, pool)]


def test_the_match_is_to_the_quoted_digits():
    report = "0.01502 6.39e+03 0.4907 119 0.04705"
    assert not unquoted("0.0150, 6.4e3, 49%, 119, 0.0470, 0.0471", report)
    assert unquoted("0.0152, 6.5e3, 48%, 121, 0.0472, 0.3", report + " 0") == ["0.0152", "6.5e3", "48%", "121", "0.0472", "0.3"]
    assert slug("Entropy collapse per head (entropy_collapse)") == "entropy-collapse-per-head-entropy_collapse"


def test_every_reference_number_on_the_page_is_the_reports():
    doc, report = DOC.read_text(), REPORT.read_text()
    links = LINK.findall(doc)
    assert len(links) >= 10, "the page quotes the reference through links to the report"
    wrong = {f"[{text}](#{anchor})": miss for text, anchor in links if (miss := unquoted(text, scope(report, anchor)))}
    assert not wrong, wrong


def test_the_page_says_which_numbers_are_measured_by_hand():
    head = DOC.read_text().split("\n## ", 1)[0]
    assert "tests/test_conditions.py" in head and "not regenerated" in head


def test_a_number_not_in_the_section_and_an_anchor_not_in_the_report_are_caught():
    section = scope(REPORT.read_text(), "attention_sink")
    assert not unquoted("0.0150, 0.0470, 0.0344", section)  # the three seeds' eviction cost
    assert unquoted("0.0777, 0.0470", section) == ["0.0777"]   # no seed's value is 0.0777
    with pytest.raises(AssertionError, match="no section"):
        scope(REPORT.read_text(), "no_such_experiment")
