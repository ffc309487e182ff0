"""docs/doctor.md's tables, derived from the check registry (never typed twice):

    python -m attention_doctor.docs docs/doctor.md     # rewrite the tables between their markers

The checks (`<!-- BEGIN checks -->` ... `<!-- END checks -->`), the causes their rows name
(`<!-- BEGIN causes -->` ... `<!-- END causes -->`) and the measurements they carry
(`<!-- BEGIN measures -->` ... `<!-- END measures -->`); tests/test_doctor_registry.py holds the
file equal to what this writes. Torch-free."""
import re
import sys
from pathlib import Path

from attention_doctor.checks import COMMON_CAUSES, COMMON_MEASURES, REGISTRY


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def checks_table() -> str:
    """One row per registered check, in the order they run."""
    out = ["In the order they run:", "",
           "| check | what it does | fails when | tolerance and why | applies to (n/a elsewhere) | reproduces |",
           "|---|---|---|---|---|---|"]
    for c in REGISTRY:
        rep = ", ".join(f"`{t}`" for t in c.targets)
        rep = "; ".join(x for x in (rep, c.thread) if x)
        out.append(f"| {c.name} | {cell(c.does)} | {cell(c.fails_when)} | {cell(c.tolerance)} | "
                   f"{cell(c.applies)} | {cell(rep)} |")
    return "\n".join(out)


def causes_table() -> str:
    """Every cause a row may name, with the outcome it comes with: each check's own, then those
    every check shares."""
    out = ["| check | cause | outcome | meaning |", "|---|---|---|---|"]
    out += [f"| {c.name} | `{k}` | {v.outcome} | {cell(v.meaning)} |" for c in REGISTRY for k, v in c.causes.items()]
    out += [f"| any | `{k}` | {v.outcome} | {cell(v.meaning)} |" for k, v in COMMON_CAUSES.items()]
    return "\n".join(out)


def measures_table() -> str:
    """Every measurement a row may carry: each check's own, then those any row may."""
    out = ["| check | label | measurement | what it is |", "|---|---|---|---|"]
    out += [f"| {c.name} | {c.short} | `{k}` | {cell(v)} |" for c in REGISTRY for k, v in c.measures.items()]
    out += [f"| any | | `{k}` | {cell(v)} |" for k, v in COMMON_MEASURES.items()]
    return "\n".join(out)


BLOCKS = {"checks": checks_table, "causes": causes_table, "measures": measures_table}


def render(text: str, blocks: dict = BLOCKS) -> str:
    """text with every marked block of `blocks` ({name: a function making its table}) replaced by its table."""
    for name, make in blocks.items():
        pat = re.compile(rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)", re.S)
        if not pat.search(text):
            raise ValueError(f"no <!-- BEGIN {name} --> ... <!-- END {name} --> block")
        text = pat.sub(lambda m: m.group(1) + make() + "\n" + m.group(2), text)
    return text


def main(argv=None, blocks: dict = BLOCKS, prog: str = "attention_doctor.docs") -> int:
    """`python -m PROG docs/doctor.md`: that file's `blocks` rewritten in place."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print(f"usage: python -m {prog} docs/doctor.md", file=sys.stderr)
        return 2
    p = Path(argv[0])
    try:
        new = render(p.read_text(), blocks)
    except ValueError as e:
        print(f"{prog}: {p}: {e}", file=sys.stderr)
        return 2
    p.write_text(new)
    print(f"{prog}: wrote the tables of {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
