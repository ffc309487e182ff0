"""The zoo's table: the result files of every architecture x implementation gathered into
zoo.csv (one row per check, or one row saying why there are none) and zoo.json (the results
whole, with the versions). Sorted, no timestamps: the same result files give the same bytes."""
import csv
import json
from pathlib import Path

from experiments.io import atomic_write, write_json
from experiments.zoo.worker import EXAMINED

COLUMNS = ["arch", "impl", "class", "status", "check", "verdict", "measured", "tolerance", "detail"]


def load(out: Path) -> list[dict]:
    rows = []
    for p in sorted((Path(out) / "runs").glob("*.json")):
        try:
            rows.append(json.loads(p.read_text()))
        except ValueError:
            continue  # written atomically, so only a foreign file can be half-written
    return sorted(rows, key=lambda r: (r["arch"], r["impl"]))


def _short(text, n=160) -> str:
    return " ".join(str(text or "").split())[:n]


def flat(results: list[dict]) -> list[dict]:
    """architecture x implementation x check."""
    out = []
    for r in results:
        base = {"arch": r["arch"], "impl": r["impl"], "class": r.get("class") or "", "status": r["status"]}
        if r["status"] == EXAMINED:
            for c in r["checks"]:
                m = c.get("measured")
                out.append({**base, "check": c["name"], "verdict": c["verdict"],
                            "measured": "" if m is None else (f"{m:.3g}" if isinstance(m, float) else m),
                            "tolerance": c.get("tolerance") or "", "detail": _short(c.get("detail"))})
        else:
            out.append({**base, "check": "", "verdict": "", "measured": "", "tolerance": "",
                        "detail": _short(r.get("reason"), 300)})
    return out


def examined_archs(results: list[dict]) -> set[str]:
    return {r["arch"] for r in results if r["status"] == EXAMINED}


def write(out: Path, archs: list[str]) -> dict:
    """zoo.csv and zoo.json for the architectures `archs` (results of others are left out)."""
    import torch
    import transformers
    wanted = set(archs)
    results = [r for r in load(out) if r["arch"] in wanted]
    rows = flat(results)

    def w(f):
        wr = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        wr.writeheader()
        wr.writerows(rows)
    atomic_write(Path(out) / "zoo.csv", w)
    seen, ran = examined_archs(results), {r["arch"] for r in results}
    summary = {"transformers": transformers.__version__, "torch": torch.__version__,
               "archs": len(archs), "examined": len(seen),
               "impls": sorted({r["impl"] for r in results}),
               "cpu_s": round(sum(r.get("cpu_s", 0) for r in results), 1),
               "not_examined": {a: sorted({f"{r['impl']}: {r['status']}: {_short(r.get('reason'), 200)}"
                                           for r in results if r["arch"] == a})
                                for a in sorted(wanted - seen) if a in ran},
               "not_run": sorted(wanted - ran),
               "results": [{k: v for k, v in r.items() if k not in ("trace",)} for r in results]}
    write_json(Path(out) / "zoo.json", summary)
    return summary
