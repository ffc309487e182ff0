"""docs/doctor.md's tables of the generated bed, derived from its records (never typed twice):

    python -m doctor_lab.generated.docs docs/doctor.md    # rewrite the tables between their markers

The axis values (`<!-- BEGIN generated_axes -->` ... `<!-- END generated_axes -->`) and the bugs
(`<!-- BEGIN generated_bugs -->` ... `<!-- END generated_bugs -->`), with the valid pairs each
bug has (combos.population); tests/test_generated_bed.py holds the file equal to what this writes."""
import sys

from attention_doctor import docs
from attention_doctor.docs import cell
from doctor_lab.generated import combos, records


def _features(fs) -> str:
    return ", ".join(sorted(fs)) or "–"


def axes_table() -> str:
    out = ["| axis | value | what it builds | gives | needs | excludes | n/a by construction |",
           "|---|---|---|---|---|---|---|"]
    out += [f"| {v.axis} | {v.name} | {cell(v.what)} | {_features(v.gives)} | {_features(v.needs)} | "
            f"{_features(v.excludes)} | {', '.join(v.na) or '–'} |" for v in records.AXES_VALUES]
    return "\n".join(out)


def bugs_table() -> str:
    pop = combos.population()
    out = [f"{len(combos.all_styles())} valid styles; every one also declares no window, one path and no save/load "
           f"({', '.join(records.ALWAYS_NA)}: n/a).", "",
           "| bug | what it plants | expected rows | needs | needs one of | excludes | why not elsewhere | more rows where | "
           "valid pairs | reproduces |", "|---|---|---|---|---|---|---|---|---|---|"]
    for b in records.BUGS_LIST:
        when = "; ".join(f"{_features(f)}: {', '.join(str(e) for e in more)}" for f, more in b.when) or "–"
        one_of = " or ".join(f"({_features(alt)})" for alt in b.needs_one_of) or "–"
        out.append(f"| {b.name} | {cell(b.what)} | {cell('; '.join(str(e) for e in b.expects))} | "
                   f"{_features(b.needs)} | {one_of} | {_features(b.excludes)} | {cell(b.fit_why) or '–'} | {cell(when)} | {len(pop[b.name])} | "
                   f"{cell(b.source)} |")
    return "\n".join(out)


BLOCKS = {"generated_axes": axes_table, "generated_bugs": bugs_table}


def render(text: str) -> str:
    """text with every marked block replaced by its table."""
    return docs.render(text, BLOCKS)


def main(argv=None) -> int:
    return docs.main(argv, BLOCKS, prog="doctor_lab.generated.docs")


if __name__ == "__main__":
    sys.exit(main())
