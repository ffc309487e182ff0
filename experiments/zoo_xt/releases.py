"""The x-transformers zoo across releases: each release's zoo.json (results/zoo_xt/<version>/)
side by side, one row per target x path x check that is not `pass` in some release, with the
first release examined that has it (a fail or warn, or a target that cannot be built or run) and
the first later one where it passes again. An option a release does not have yet is `absent`."""
import csv
import json
from pathlib import Path

from experiments.io import atomic_write

FIELDS = ["target", "path", "check"]


def _key(v: str):
    return tuple(int(x) if x.isdigit() else x for x in v.split("."))


def load(out: Path) -> dict[str, dict]:
    """version -> its zoo.json, oldest first."""
    found = {}
    for p in sorted(Path(out).glob("*/zoo.json")):
        z = json.loads(p.read_text())
        found[z.get("version", p.parent.name)] = z
    return dict(sorted(found.items(), key=lambda kv: _key(kv[0])))


ABSENT = ("unrecognized kwargs", "unexpected keyword argument")   # x-transformers' words for an unknown option
HAS_IT = {"fail", "warn", "build_error", "forward_error", "doctor_target_error", "doctor_error", "timeout", "crash",
          "memory"}


def outcomes(z: dict) -> dict[tuple, str]:
    """(target, path, check) -> the verdict; (target, path, '') -> the status of a target not
    examined (`absent` for an option the release does not know)."""
    out = {}
    for r in z["results"]:
        if r["status"] == "examined":
            for c in r["checks"]:
                out[(r["arch"], r["impl"], c["name"])] = c["verdict"].split(":")[0]
        elif r["status"] == "build_error" and any(w in r.get("reason", "") for w in ABSENT):
            out[(r["arch"], r["impl"], "")] = "absent"
        else:
            out[(r["arch"], r["impl"], "")] = r["status"]
    return out


def across(zoos: dict[str, dict]) -> list[dict]:
    """Rows for every key whose outcome is not `pass` in some release (or differs between releases)."""
    per = {v: outcomes(z) for v, z in zoos.items()}
    keys = sorted(set().union(*per.values())) if per else []
    rows = []
    for k in keys:
        seen = [per[v].get(k, "-") for v in zoos]
        if all(s in ("pass", "-", "absent") for s in seen):   # passes wherever the option exists
            continue
        bad = [v for v, s in zip(zoos, seen) if s in HAS_IT]
        first = bad[0] if bad else ""
        after = [v for v, s in zip(zoos, seen) if _key(v) > _key(first) and s == "pass"] if first else []
        rows.append({**dict(zip(FIELDS, k)), **dict(zip(zoos, seen)), "first_with": first,
                     "first_fixed": after[0] if after else ""})
    return rows


def write_across(out: Path) -> str:
    zoos = load(out)
    if not zoos:
        return f"no release tables under {out}"
    rows = across(zoos)

    def w(f):
        wr = csv.DictWriter(f, fieldnames=[*FIELDS, *zoos, "first_with", "first_fixed"], lineterminator="\n")
        wr.writeheader()
        wr.writerows(rows)
    atomic_write(Path(out) / "releases.csv", w)
    return f"{len(rows)} target x path x check outcomes not pass in some of {', '.join(zoos)}: {out}/releases.csv"
