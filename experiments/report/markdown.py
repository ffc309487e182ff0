"""Headings of a markdown page, and a report block nested under a page's own heading.

A block is written for REPORT.md, where its title heading stands at the top level (`## Catalogue`).
Embedded in another page (README.md), the page already has a heading for it: the block's title
is dropped and its other headings move below the page's.
"""
import re

HEADING = re.compile(r"^(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
FENCE = re.compile(r"^[ \t]*(```|~~~)")


def headings(md: str) -> list[tuple[int, int, str]]:
    """(line index, level, text) of every ATX heading outside fenced code (a `# comment` in a
    shell block is not a heading)."""
    out, fenced = [], False
    for i, line in enumerate(md.splitlines()):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            out.append((i, len(m.group(1)), m.group(2)))
    return out


def nest(block: str, level: int) -> str:
    """`block` as embedded under a page heading of `level` (0: no heading above; left as is):
    a leading title heading is dropped, the rest keep their order and move below `level`."""
    hs = headings(block)
    if level <= 0 or not hs:
        return block
    lines = block.splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip())
    drop = hs[0][0] == first and hs[0][1] == min(lv for _, lv, _ in hs)  # the block's title
    rest = [h for h in hs if not (drop and h[0] == first)]
    if rest:
        shift = level + 1 - min(lv for _, lv, _ in rest)
        for i, lv, text in rest:
            lines[i] = "#" * min(6, lv + shift) + " " + text
    if drop:
        lines = lines[first + 1:]
    return "\n".join(lines).strip("\n") + "\n"
