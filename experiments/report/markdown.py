"""Headings of a markdown page, and a report block nested under a page's own heading.

A block is written for REPORT.md, where its title heading stands at the top level (`## Catalogue`).
Embedded in another page (README.md), the page already has a heading for it: the block's title
is dropped and its other headings move below the page's. A page's blocks are marked
`<!-- BEGIN OWNER:NAME -->` ... `<!-- END OWNER:NAME -->`: each report fills the blocks of its own
OWNER (the suite's `report`, the doctor's lab `lab`) and leaves the others as they are.
"""
import os
import re
from pathlib import Path

from experiments.io import write_text

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


BLOCK = re.compile(r"<!-- BEGIN (\w+):(\S+) -->.*?<!-- END \1:\2 -->", re.S)


def page_level(text: str, pos: int) -> int:
    """Level of the page's own heading above `pos` (headings inside any report's blocks do not count)."""
    hs = headings(BLOCK.sub("", text[:pos]))
    return hs[-1][1] if hs else 0


def update_readme(readme: Path, blocks: dict[str, str], out: Path, owner: str = "report",
                  report: str = "REPORT.md", dirs: tuple = ("figures",)) -> list[str]:
    """Replace each block of `owner` by its text from `blocks`, nested under the README's heading
    above it (nest); links into `dirs` (figures) and to a section (`#anchor`) of the page `report`
    in `out` are rewritten relative to the README. Returns the names of `owner`'s markers with no
    block to fill (left as they were); other owners' blocks are not touched."""
    text = readme.read_text()
    prefix = os.path.relpath(Path(out).resolve(), Path(readme).resolve().parent).replace(os.sep, "/")
    missing = []

    def fill(m):
        who, name = m.group(1), m.group(2)
        if who != owner:
            return m.group(0)
        if name not in blocks:
            missing.append(name)
            return m.group(0)
        body = nest(blocks[name], page_level(text, m.start()))
        for d in dirs:
            body = body.replace(f"]({d}/", f"]({prefix}/{d}/")
        body = body.replace("](#", f"]({prefix}/{report}#")  # a section of the report, from the README
        return f"<!-- BEGIN {owner}:{name} -->\n{body.strip()}\n<!-- END {owner}:{name} -->"
    new = BLOCK.sub(fill, text)
    if new != text:
        write_text(readme, new)
    return missing
