"""docs/doctor.md's tables of the generated bed, derived from its records (never typed twice):

    python -m doctor_lab.generated.docs docs/doctor.md    # rewrite the tables between their markers

The axis values (`<!-- BEGIN generated_axes -->` ... `<!-- END generated_axes -->`) and the bugs
(`<!-- BEGIN generated_bugs -->` ... `<!-- END generated_bugs -->`), with the valid pairs each
bug has (combos.population); tests/test_generated_bed.py holds the file equal to what this writes."""
import re
import sys
from pathlib import Path

from doctor_lab.generated import combos, records


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _features(fs) -> str:
    return ", ".join(sorted(fs)) or "–"


def axes_table() -> str:
    out = ["| axis | value | what it builds | gives | needs | excludes | n/a by construction |",
           "|---|---|---|---|---|---|---|"]
    out += [f"| {v.axis} | {v.name} | {_cell(v.what)} | {_features(v.gives)} | {_features(v.needs)} | "
            f"{_features(v.excludes)} | {', '.join(v.na) or '–'} |" for v in records.AXES_VALUES]
    return "\n".join(out)


def bugs_table() -> str:
    pop = combos.population()
    out = [f"{len(combos.all_styles())} valid styles; every one also declares no window, one path and no save/load "
           f"({', '.join(records.ALWAYS_NA)}: n/a).", "",
           "| bug | what it plants | expected rows | needs | needs one of | excludes | more rows where | valid pairs | "
           "reproduces |", "|---|---|---|---|---|---|---|---|---|"]
    for b in records.BUGS_LIST:
        when = "; ".join(f"{_features(f)}: {', '.join(str(e) for e in more)}" for f, more in b.when) or "–"
        one_of = " or ".join(f"({_features(alt)})" for alt in b.needs_one_of) or "–"
        out.append(f"| {b.name} | {_cell(b.what)} | {_cell('; '.join(str(e) for e in b.expects))} | "
                   f"{_features(b.needs)} | {one_of} | {_features(b.excludes)} | {_cell(when)} | {len(pop[b.name])} | "
                   f"{_cell(b.source)} |")
    return "\n".join(out)


BLOCKS = {"generated_axes": axes_table, "generated_bugs": bugs_table}


def render(text: str) -> str:
    """text with every marked block replaced by its table."""
    for name, make in BLOCKS.items():
        pat = re.compile(rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)", re.S)
        if not pat.search(text):
            raise ValueError(f"no <!-- BEGIN {name} --> ... <!-- END {name} --> block")
        text = pat.sub(lambda m: m.group(1) + make() + "\n" + m.group(2), text)
    return text


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print("usage: python -m doctor_lab.generated.docs docs/doctor.md", file=sys.stderr)
        return 2
    p = Path(argv[0])
    try:
        new = render(p.read_text())
    except ValueError as e:
        print(f"doctor_lab.generated.docs: {p}: {e}", file=sys.stderr)
        return 2
    p.write_text(new)
    print(f"doctor_lab.generated.docs: wrote the tables of {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
