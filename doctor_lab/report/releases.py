"""The zoo over transformers releases: each release's table (results/zoo/zoo.json for the
installed release, results/zoo/releases/<version>/zoo.json for the others), triaged by the same
triage, gives per problem the releases that have it, the first release examined that has it and
the first after it that fixed it; per architecture and release one outcome (the picture's cells)."""
import csv
import io
import json
import re
from pathlib import Path

from doctor_lab.report import triage

# a cell's outcome, worst first: an architecture shows the worst of its rows in that release
OUTCOMES = {
    "untriaged": ("untriaged fail or warn", "#7b3294"),
    "finding": ("new finding", "#d7191c"),
    "artifact": ("finding that needs a random-init condition", "#fdae61"),
    "false_alarm": ("doctor false alarm", "#abd9e9"),
    "inconclusive": ("a check inconclusive", "#b2abd2"),
    "known": ("known behaviour only", "#ffffbf"),
    "pass": ("every check passed or n/a", "#1a9641"),
    "not_examined": ("not examined (build error, crash, skip)", "#404040"),
    "not_run": ("in the release, not run in its table", "#ececec"),
    "absent": ("not in this release", "#ffffff"),
}


def version_key(v: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def load_tables(root: Path) -> dict[str, dict]:
    """version -> zoo.json, oldest first: root/zoo.json (the installed release's), and each release's
    under root/releases/<version>/ or root/<version>/ (a library zoo's layout); the installed
    release's table wins over a copy of the same version."""
    root = Path(root)
    found = {}
    for p in [*sorted(root.glob("releases/*/zoo.json")), *sorted(root.glob("*/zoo.json")), root / "zoo.json"]:
        if p.exists():
            z = json.loads(p.read_text())
            if z.get("results"):
                found[triage.release_of(z)] = z
    return dict(sorted(found.items(), key=lambda kv: version_key(kv[0])))


def needs_of(z: dict) -> dict[tuple, list[str]]:
    """(arch, impl, check) -> what the row needs (empty: it held under every condition), for the
    rows the zoo reran (zoo.json's `confirm`)."""
    return {(e["arch"], e["impl"], e["check"]): e.get("needs", []) for e in z.get("confirm", [])}


def problem_kind(p: dict, needs: dict) -> str:
    """A finding whose every rerun row passed under some condition is an artifact of it."""
    if p["kind"] != "finding":
        return p["kind"]
    got = [needs.get((f["arch"], f["impl"], f["check"])) for f in p["rows"]]
    return "artifact" if got and all(got) else "finding"


def cells(z: dict, entries: list[dict], spec: triage.Spec = triage.TRANSFORMERS) -> dict[str, str]:
    """arch -> its outcome in this table (the worst of its rows)."""
    rank = {k: i for i, k in enumerate(OUTCOMES)}
    needs = needs_of(z)
    out: dict[str, str] = {}

    def worse(arch, kind):
        if arch not in out or rank[kind] < rank[out[arch]]:
            out[arch] = kind
    for r in z["results"]:  # one implementation examined is enough for "examined"
        if spec.is_absent(r):   # an option this release does not have yet
            worse(r["arch"], "absent")
        elif r["status"] != "examined":
            worse(r["arch"], "not_examined")
        else:
            worse(r["arch"], "pass")
            if any(triage.outcome(c) == "inconclusive" for c in r["checks"]):
                worse(r["arch"], "inconclusive")
    for p in triage.problems(spec.table_flags(z), entries):
        kind = problem_kind(p, needs)
        for f in p["rows"]:
            worse(f["arch"], kind)
    for arch in z.get("not_run", []):
        out.setdefault(arch, "not_run")
    return out


def over_releases(tables: dict[str, dict], entries: list[dict] | None = None,
                  spec: triage.Spec = triage.TRANSFORMERS) -> dict:
    """{releases, problems: [{key, kind, note, ref, rows: {version: n}, archs, first_seen, fixed_in}],
    cells: {arch: {version: outcome}}, cost: {version: {...}}}. A problem is fixed in a release
    where its architectures (targets) are examined, or raise for another reason, without its rows."""
    entries = spec.entries() if entries is None else entries
    versions = list(tables)
    probs: dict[str, dict] = {}
    flagged = {v: spec.table_flags(z) for v, z in tables.items()}
    examined = {v: {r["arch"] for r in z["results"] if r["status"] == "examined"}
                | {f["arch"] for f in flagged[v] if f["verdict"] == "error"} for v, z in tables.items()}
    for v, z in tables.items():
        needs = needs_of(z)
        for p in triage.problems(flagged[v], entries):
            e = p["entry"] or {}
            q = probs.setdefault(p["key"], {"key": p["key"], "kind": p["kind"], "note": e.get("note", ""),
                                            "ref": e.get("thread") or e.get("finding") or "", "rows": {}, "archs": set(),
                                            "kinds": {}})
            q["rows"][v] = len(p["rows"])
            q["kinds"][v] = problem_kind(p, needs)
            q["archs"] |= {f["arch"] for f in p["rows"]}
    for q in probs.values():
        seen = [v for v in versions if v in q["rows"]]
        q["first_seen"] = seen[0]
        later = [v for v in versions[versions.index(seen[-1]) + 1:] if q["archs"] & examined[v]]
        q["fixed_in"] = later[0] if later else ""
        q["examined_in"] = [v for v in versions if q["archs"] & examined[v]]
        q["kind"] = q["kinds"][seen[-1]]  # as the latest release that has it shows it
        q["archs"] = sorted(q["archs"])
        del q["kinds"]
    archs = sorted({r["arch"] for z in tables.values() for r in z["results"]}
                   | {a for z in tables.values() for a in z.get("not_run", [])})
    per = {v: cells(z, entries, spec) for v, z in tables.items()}
    return {"releases": versions,
            "problems": sorted(probs.values(), key=lambda q: (version_key(q["first_seen"]), q["key"])),
            "cells": {a: {v: per[v].get(a, "absent") for v in versions} for a in archs},
            "cost": {v: {**z.get("cost", {}), "examined": z["examined"], "archs": z.get("archs", z.get("targets")), "with": z.get("with", {}),
                         "checks_cpu_s": z.get("cpu_s")} for v, z in tables.items()}}


def shown_rows(q: dict, v: str):
    """A problem's rows in release v: their count, 0 where its architectures were examined without it,
    '' where none of them was examined (not in that release, or not built)."""
    return q["rows"].get(v, 0 if v in q["examined_in"] else "")


CSV_COLUMNS = ["problem", "kind", "first_seen", "fixed_in", "archs"]


def to_csv(over: dict) -> str:
    """One row per problem: its kind, the first release examined that has it, the first release
    after its last that no longer has it (its architectures examined there), its rows per release."""
    f = io.StringIO()
    w = csv.writer(f, lineterminator="\n")
    w.writerow([*CSV_COLUMNS, *(f"rows {v}" for v in over["releases"]), "thread or finding"])
    for q in over["problems"]:
        w.writerow([q["key"], q["kind"], q["first_seen"], q["fixed_in"] or "open", " ".join(q["archs"]),
                    *(shown_rows(q, v) for v in over["releases"]), q["ref"]])
    return f.getvalue()
