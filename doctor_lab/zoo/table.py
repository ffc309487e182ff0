"""The zoo's table: the result files of every architecture x implementation gathered into
zoo.csv (one row per check, or one row saying why there are none; a row rerun under the
conditions of conditions.py says how each went and what it needs) and zoo.json (the results
whole, the reruns, the versions and the run's cost). Sorted, no timestamps: the same result
files give the same bytes."""
import csv
import json
from pathlib import Path

from attention_doctor.result import Row
from doctor_lab.report.triage import outcome
from doctor_lab.zoo import cost
from doctor_lab.zoo.conditions import CONDITIONS, needs
from doctor_lab.zoo.worker import EXAMINED
from experiments.io import atomic_write

COLUMNS = ["arch", "impl", "class", "status", "checks_run", "check", "verdict", "cause", "measured", "tolerance",
           "reruns", "needs", "detail"]


def key(r: dict) -> tuple:
    """A result's place in a table: architecture, the option values it was built with (the option
    zoo's, doctor_lab/zoo/options.py; '' for the default config), implementation."""
    return r["arch"], r.get("option_label", ""), r["impl"]


def load(out: Path, sub: str = "runs") -> list[dict]:
    rows = []
    for p in sorted((Path(out) / sub).glob("*.json")):
        try:
            rows.append(json.loads(p.read_text()))
        except ValueError:
            continue  # written atomically, so only a foreign file can be half-written
    return sorted(rows, key=key)


def _short(text, n=160) -> str:
    return " ".join(str(text or "").split())[:n]


def reruns(results: list[dict], reran: list[dict]) -> list[dict]:
    """One entry per rerun row (arch, impl, check): its verdict, each condition's outcome and
    number, and what it needs (the conditions under which it passes)."""
    verdicts = {(r["arch"], r["impl"], c["name"]): c
                for r in results if r["status"] == EXAMINED for c in r["checks"]}
    out = []
    for rec in reran:
        for check in rec.get("checks", []):
            row = verdicts.get((rec["arch"], rec["impl"], check))
            if row is None or outcome(row) not in ("fail", "warn"):   # a rerun of a row that now passes is stale
                continue
            conds = {}
            for c in CONDITIONS:
                got = (rec.get("conditions") or {}).get(c.name) or {}
                mine = got.get(check) or {}
                why = got.get("error") or rec.get("reason") or "not rerun"
                ran = Row.from_dict({"name": check, **mine}) if mine else Row(check, "inconclusive", why[:200])
                conds[c.name] = {"outcome": ran.outcome.value, "reason": ran.reason, "measured": ran.measured,
                                 "changed": got.get("changed", "")}
            out.append({"arch": rec["arch"], "impl": rec["impl"], "check": check,
                        "verdict": Row.from_dict({"name": check, **row}).verdict,
                        "conditions": conds, "needs": needs(row, conds)})
    return sorted(out, key=lambda e: (e["arch"], e["impl"], e["check"]))


def flat(results: list[dict], reran: list[dict] = ()) -> list[dict]:
    """architecture x implementation x check."""
    by = {(e["arch"], e["impl"], e["check"]): e for e in reran}
    out = []
    for r in results:
        info = r.get("info") or {}
        ran = (f"{info['checks_run']}/{info['checks_total']}" if "checks_total" in info
               else str(sum(outcome(c) in ("pass", "fail", "warn") for c in r.get("checks", []))))
        base = {"arch": r["arch"], "impl": r["impl"], "class": r.get("class") or "", "status": r["status"],
                "checks_run": ran if r["status"] == EXAMINED else "",
                **({"options": r["option_label"]} if "option_label" in r else {})}
        if r["status"] == EXAMINED:
            for c in r["checks"]:
                m = c.get("measured")
                e = by.get((r["arch"], r["impl"], c["name"]))
                out.append({**base, "check": c["name"], "verdict": Row.from_dict(c).verdict, "cause": c.get("cause") or "",
                            "measured": "" if m is None else (f"{m:.3g}" if isinstance(m, float) else m),
                            "tolerance": c.get("tolerance") or "",
                            "reruns": " ".join(f"{k}:{outcome(v)}" for k, v in e["conditions"].items()) if e else "",
                            "needs": "; ".join(e["needs"]) if e else "",
                            "detail": _short(c.get("detail"))})
        else:
            out.append({**base, "check": "", "verdict": "", "cause": "", "measured": "", "tolerance": "", "reruns": "",
                        "needs": "",
                        "detail": _short(r.get("reason"), 300)})
    return out


def examined_archs(results: list[dict]) -> set[str]:
    return {r["arch"] for r in results if r["status"] == EXAMINED}


def _why_not(results: list[dict], arch: str) -> list[str]:
    """'eager+sdpa: timeout: killed after ...': one line per distinct (status, reason)."""
    by: dict[tuple, list[str]] = {}
    for r in results:
        if r["arch"] == arch:
            by.setdefault((r["status"], _short(r.get("reason"), 400)), []).append(r["impl"])
    return [f"{'+'.join(sorted(i))}: {s}: {why}" for (s, why), i in sorted(by.items())]


def _verdicts(r: dict) -> tuple:
    """What a rerun must change to rewrite a row: its status, and per check its outcome, reason,
    cause and the names of its measurements (a row of an older schema, without them, is rewritten)."""
    return r["status"], tuple((c["name"], c.get("outcome"), c.get("reason"), c.get("cause") or "",
                               tuple(sorted(c.get("measurements") or ()))) for c in r.get("checks", ()))


def committed(out: Path, results: list[dict], versions: dict, wanted=()) -> tuple[list[dict] | None, dict | None]:
    """The results to write, each (arch, impl) whose status and every check's verdict and cause are
    as the table already there holds them taken as it holds them (a rerun's noise-level numbers,
    9.03e-08 -> 1.81e-07, rewrite nothing: a clone stays clean), with the table's summary; (None,
    the summary) where nothing changed at all: the files are left as they are. An architecture of
    `wanted` with no result here keeps the table's rows. Other `versions` (torch, the library's
    release) than the table's: every result is new."""
    p = Path(out) / "zoo.json"
    try:
        old = json.loads(p.read_text()) if p.exists() else None
    except ValueError:   # a table that does not parse is rewritten whole
        old = None
    if not old or not isinstance(old.get("results"), list) or any(old.get(k) != v for k, v in versions.items()):
        return results, None
    before = {key(r): r for r in old["results"]}
    # an architecture with no result file here (a clone holds the committed table, not the runs; a rerun
    # of a few with --arch) keeps its committed rows: the table is never cut to what this machine ran
    ran = {r["arch"] for r in results}
    results = sorted(results + [r for r in old["results"] if r["arch"] in wanted and r["arch"] not in ran], key=key)
    kept = [before[k] if k in before and _verdicts(before[k]) == _verdicts(r) else r
            for k, r in ((key(r), r) for r in results)]
    unchanged = len(before) == len(results) and all(a is b for a, b in zip(
        kept, (before.get(key(r)) for r in results)))
    if unchanged:
        print(f"{out}: no verdict changed; zoo.csv and zoo.json left as they are")
        return None, old
    return kept, old


def write(out: Path, archs: list[str], key: str = "") -> dict:
    """zoo.csv and zoo.json for the architectures `archs` (results of others are left out); the
    cost of the sessions of `key` (cost.py)."""
    import torch
    import transformers
    wanted = set(archs)
    results = [r for r in load(out) if r["arch"] in wanted]
    if not results:  # a clean clone has the committed table but no result files: keep the table
        return json.loads((Path(out) / "zoo.json").read_text()) if (Path(out) / "zoo.json").exists() else {
            "archs": len(archs), "examined": 0}
    versions = {"transformers": transformers.__version__, "torch": torch.__version__, "with": _beside()}
    here = {r["arch"] for r in results}
    results, old = committed(out, results, versions, wanted)
    if results is None:
        return old
    reran = reruns(results, [r for r in load(out, "confirm") if r["arch"] in wanted])
    if old:   # the committed reruns of the architectures kept from the table (none ran here)
        reran = sorted(reran + [e for e in old.get("confirm", []) if e["arch"] in wanted - here],
                       key=lambda e: (e["arch"], e["impl"], e["check"]))
    rows = flat(results, reran)

    columns = COLUMNS[:1] + ["options"] + COLUMNS[1:] if any("options" in r for r in rows) else COLUMNS

    def w(f):
        wr = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        wr.writeheader()
        wr.writerows(rows)
    atomic_write(Path(out) / "zoo.csv", w)
    seen, ran = examined_archs(results), {r["arch"] for r in results}
    summary = {**versions, "archs": len(archs), "examined": len(seen),
               "impls": sorted({r["impl"] for r in results}),
               "cpu_s": round(sum(r.get("cpu_s", 0) for r in results), 1),
               "cost": _cost(out, key, old, len(wanted)),
               "confirm": reran,
               "not_examined": {a: _why_not(results, a) for a in sorted(wanted - seen) if a in ran},
               "not_run": sorted(wanted - ran),
               "results": [_slim(r) for r in results]}
    text = json.dumps(summary, sort_keys=True, separators=(",", ":"), default=str)
    atomic_write(Path(out) / "zoo.json", lambda f: f.write(text.replace(',{"arch"', ',\n{"arch"')))
    return summary


def _cost(out: Path, key: str, old: dict | None, archs: int) -> dict:
    """What this doctor's sessions spent on the table; where they ran fewer architectures than it
    holds (a rerun of a few with --arch), the committed table's cost, from the run that examined
    them all: the rerun's own would read as the whole table's."""
    mine = cost.total(out, key) if key else {}
    if old and old.get("cost") and mine.get("archs_run", 0) < archs:
        return old["cost"]
    return mine


def _beside() -> dict:
    """The versions of the packages a transformers release brings its own of (its --target dir)."""
    out = {}
    try:
        import huggingface_hub
        out["huggingface_hub"] = huggingface_hub.__version__
    except ImportError:
        out["huggingface_hub"] = None
    try:
        import tokenizers
        out["tokenizers"] = tokenizers.__version__
    except ImportError:
        out["tokenizers"] = None
    return out


DERIVED = ("thread", "experiment")   # a row's, from its check's record (attention_doctor.checks.BY_NAME)


def _rounded(v):
    """Measurements at 6 significant digits (a table, not a checkpoint: the row's verdict is the doctor's)."""
    if isinstance(v, float):
        return float(f"{v:.6g}")
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_rounded(x) for x in v]
    return v


def _slim(r: dict) -> dict:
    """A result as zoo.json keeps it: no traceback, no per-check timings, details cut at 400 chars,
    measurements rounded, nothing a check's record says."""
    r = {k: v for k, v in r.items() if k != "trace"}
    if "info" in r:
        r["info"] = {k: v for k, v in r["info"].items() if k != "seconds"}
    if "checks" in r:
        r["checks"] = [{**{k: v for k, v in c.items() if k not in DERIVED}, "detail": _short(c.get("detail"), 400),
                        **({"measurements": _rounded(c["measurements"])} if "measurements" in c else {})}
                       for c in r["checks"]]
    return r


def write_releases(out: Path) -> Path | None:
    """The table over releases (releases.csv, beside the installed release's table) when `out` is
    a release's dir under <root>/releases/ or a root with releases/ in it; None otherwise."""
    from doctor_lab.report.releases import load_tables, over_releases, to_csv
    out = Path(out)
    root = out.parent.parent if out.parent.name == "releases" else out if (out / "releases").is_dir() else None
    if root is None:
        return None
    tables = load_tables(root)
    if not tables:
        return None
    text = to_csv(over_releases(tables))
    atomic_write(root / "releases.csv", lambda f: f.write(text))
    return root / "releases.csv"
