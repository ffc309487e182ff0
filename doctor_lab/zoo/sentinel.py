"""The sentinel: what changed in the zoo from one transformers release to another. Only the
differences, each row read by the doctor's parser (Row.from_dict), its move classified as a
maintainer's `attention-doctor --against` classifies it (attention_doctor.compare), grouped by
check and cause:

    new fails      a fail or warn in NEW where OLD passed or was n/a (or the architecture is new)
    new blind      an inconclusive row in NEW where OLD's was not
    fixed          a fail or warn in OLD that passes (or is n/a) in NEW
    problems       triage problems (doctor_lab/zoo/triage.yaml) present in one release only
    architectures  examined in one release only

    python -m doctor_lab.zoo --release 5.25.0 --pinned DIR --against 5.23.0
    python -m doctor_lab.zoo --table --release 5.25.0 --pinned DIR --against 5.23.0   # from the tables

Writes <NEW's table dir>/against-OLD.md. Pure Python (reads committed tables)."""
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from attention_doctor.compare import classify
from attention_doctor.result import PASS, Row
from doctor_lab.report import triage
from doctor_lab.report.releases import load_tables


@dataclass
class Change:
    """One row that moved: where, and its outcome and cause in each release (None: not examined)."""
    arch: str
    impl: str
    check: str
    old: Row | None
    new: Row | None

    def key(self) -> tuple[str, str]:
        """(check, cause) of the release the change is about: NEW's where it has the row, else OLD's."""
        row = self.new if self.new is not None and self.new.outcome is not PASS else self.old
        return self.check, row.cause or "-"


@dataclass
class Delta:
    """Everything that differs between two zoo tables."""
    old: str
    new: str
    new_fails: list[Change] = field(default_factory=list)
    new_blind: list[Change] = field(default_factory=list)
    fixed: list[Change] = field(default_factory=list)
    problems_new: list[str] = field(default_factory=list)
    problems_gone: list[str] = field(default_factory=list)
    archs_new: list[str] = field(default_factory=list)
    archs_gone: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not any((self.new_fails, self.new_blind, self.fixed, self.problems_new, self.problems_gone,
                        self.archs_new, self.archs_gone))


def _rows(z: dict) -> dict[tuple, Row]:
    """(architecture, or architecture[options] for the option zoo's rows, impl, check) -> its row."""
    return {(triage.row_name(r["arch"], r.get("option_label", "")), r["impl"], c["name"]): Row.from_dict(c)
            for r in z["results"] if r.get("status") == "examined" for c in r.get("checks", [])}


def _examined(z: dict) -> set[str]:
    return {triage.row_name(r["arch"], r.get("option_label", "")) for r in z["results"] if r.get("status") == "examined"}


def _problems(z: dict, entries: list[dict]) -> set[str]:
    return {p["key"] for p in triage.problems(triage.TRANSFORMERS.table_flags(z), entries)}


def compare(old: dict, new: dict, entries: list[dict] | None = None) -> Delta:
    """The Delta from zoo table `old` to `new` (zoo.json dicts)."""
    entries = triage.load() if entries is None else entries
    a, b = _rows(old), _rows(new)
    d = Delta(triage.release_of(old), triage.release_of(new))
    lists = {"new_fail": d.new_fails, "new_blind": d.new_blind, "fixed": d.fixed}   # the kinds a release table shows
    for k in sorted(set(a) | set(b)):
        o, n = a.get(k), b.get(k)
        kind = classify(o, n)
        if kind in lists:
            lists[kind].append(Change(*k, o, n))
    po, pn = _problems(old, entries), _problems(new, entries)
    d.problems_new, d.problems_gone = sorted(pn - po), sorted(po - pn)
    eo, en = _examined(old), _examined(new)
    d.archs_new, d.archs_gone = sorted(en - eo), sorted(eo - en)
    return d


def _grouped(changes: list[Change]) -> list[str]:
    by: dict[tuple, list[Change]] = defaultdict(list)
    for c in changes:
        by[c.key()].append(c)
    lines = []
    for (check, cause), cs in sorted(by.items()):
        where = ", ".join(f"{c.arch} ({c.impl}: {c.old.outcome if c.old else 'new'} -> "
                          f"{c.new.outcome if c.new else 'gone'})" for c in cs)
        lines.append(f"| {check} | {cause} | {len(cs)} | {where} |")
    return lines


def render(d: Delta, flags: str = "") -> str:
    """The Delta as markdown: a summary line, then one table per kind of change."""
    out = [f"# The zoo: transformers {d.new} against {d.old}", "",
           f"Only what changed (`python -m doctor_lab.zoo{flags} --release {d.new} --pinned DIR --against {d.old}`): "
           f"{len(d.new_fails)} new fail or warn rows, {len(d.new_blind)} new inconclusive, {len(d.fixed)} fixed; "
           f"problems new {len(d.problems_new)}, gone {len(d.problems_gone)}; architectures examined new "
           f"{len(d.archs_new)}, gone {len(d.archs_gone)}.", ""]
    if d.empty:
        return "\n".join(out + ["Nothing changed.", ""])
    for title, changes in (("New fail or warn", d.new_fails), ("New inconclusive", d.new_blind), ("Fixed", d.fixed)):
        if changes:
            out += [f"## {title} ({len(changes)} rows)", "", "| check | cause | rows | where (impl: old -> new) |",
                    "|---|---|---|---|", *_grouped(changes), ""]
    for title, items in (("Problems new in " + d.new, d.problems_new), ("Problems gone in " + d.new, d.problems_gone),
                         ("Architectures examined in " + d.new + " only", d.archs_new),
                         ("Architectures examined in " + d.old + " only", d.archs_gone)):
        if items:
            out += [f"## {title} ({len(items)})", "", ", ".join(items), ""]
    return "\n".join(out)


def table_of(root: Path, version: str) -> dict | None:
    """The committed zoo table of `version` under root (results/zoo), None if there is none."""
    return load_tables(root).get(version)


def write(out_dir: Path, root: Path, old: str, flags: str = "") -> tuple[Path, Delta]:
    """out_dir/against-OLD.md for the table in out_dir against OLD's under root; ValueError (one
    line) when either table is missing. flags: what the page's command line names between the module
    and --release (the option zoo's `--options --arch ...`)."""
    new_path = Path(out_dir) / "zoo.json"
    if not new_path.exists():
        raise ValueError(f"no zoo table in {out_dir} to compare")
    new = json.loads(new_path.read_text())
    before = table_of(root, old)
    if before is None:
        known = ", ".join(load_tables(root)) or "none"
        raise ValueError(f"--against {old}: no zoo table of transformers {old} under {root} (tables: {known})")
    d = compare(before, new)
    p = Path(out_dir) / f"against-{old}.md"
    p.write_text(render(d, flags))
    return p, d
