"""The backtest's committed table: results/backtest/backtest.csv (one line per regression x release x
architecture x implementation x check: the doctor's outcome, cause and measured value, and the
regression's verdict), backtest.json (the same, with the recall; the report reads it) and
backtest.md (the report's section as a page). Sorted as the record is, no timestamps: the same runs
give the same bytes (the last run's wall time aside, kept until a run does work again)."""
import csv
import json
from pathlib import Path

from doctor_lab.backtest import record as rec
from doctor_lab.backtest.outcomes import CAUGHT, IMPRECISE, Cell, Verdict
from doctor_lab.backtest.plan import Plan
from doctor_lab.report.sections import backtest as section
from experiments.io import atomic_write, write_text

COLUMNS = ["id", "verdict", "expected_check", "role", "release", "arch", "impl", "check", "outcome", "reason",
           "cause", "measured", "not_run"]


def reproducible(e: rec.Regression) -> bool:
    """An entry the backtest can be held to on CPU: it has a repro and needs no GPU."""
    return e.repro is not None and rec.Condition.GPU not in e.condition


def entry(p: Plan, cs: list[Cell], v: Verdict) -> dict:
    e = p.entry
    return {"id": e.id, "title": e.title, "check": e.check, "probe": p.nearest, "checks_run": list(p.checks),
            "releases": p.releases, "architectures": list(e.architectures), "implementations": list(p.impls),
            "reproducible": reproducible(e), "verdict": v.kind, "text": v.text, "cells": [c.to_dict() for c in cs],
            "library": e.library, "options": p.options, "config": dict(p.config)}


def summary(entries: list[dict], last_run: dict | None) -> dict:
    held = [e for e in entries if e["reproducible"]]
    return {"command": section.COMMAND, "record": "doctor_lab/backtest/record.yaml",
            "recall": {"caught": sum(e["verdict"] == CAUGHT for e in held),
                       "imprecise": sum(e["verdict"] == IMPRECISE for e in held),
                       "reproducible": len(held), "entries": len(entries),
                       "needs_probe": sum(e["probe"] for e in entries)},
            "last_run": last_run or {}, "entries": entries}


def recall_line(s: dict) -> str:
    r = s["recall"]
    return (f"recall: {r['caught']} caught of {r['reproducible']} CPU-reproducible regressions"
            f" ({r['caught'] + r['imprecise']} counting caught, imprecise); {r['needs_probe']} need a probe the doctor lacks")


def csv_rows(s: dict) -> list[dict]:
    out = []
    for e in s["entries"]:
        base = {"id": e["id"], "verdict": e["verdict"], "expected_check": e["check"]}
        if not e["cells"]:
            out.append({**base, "not_run": e["text"]})
        for c in e["cells"]:
            m = c["measured"]
            out.append({**base, **{k: c[k] for k in ("role", "release", "arch", "impl", "check", "outcome", "reason",
                                                     "cause", "not_run")},
                        "measured": "" if m is None else (f"{m:.6g}" if isinstance(m, float) else m)})
    return out


def previous_run(results: Path) -> dict | None:
    try:
        return json.loads((Path(results) / "backtest.json").read_text()).get("last_run")
    except (OSError, ValueError):
        return None


def write(results: Path, s: dict) -> None:
    results = Path(results)

    def w(f):
        wr = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        wr.writeheader()
        wr.writerows(csv_rows(s))
    atomic_write(results / "backtest.csv", w)
    write_text(results / "backtest.json", json.dumps(s, indent=1, sort_keys=True, default=str) + "\n")
    write_text(results / "backtest.md", section.page(s))
