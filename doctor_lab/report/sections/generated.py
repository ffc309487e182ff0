"""The generated styles bed in the report: results/doctor/generated.json (written by `python -m
doctor_lab.generated --out DIR`, then copied there), its size, the share it gets right, per bug and
per axis value, and every miss with its reason (doctor_lab/generated/triage.py)."""
import json
from collections import Counter, defaultdict
from pathlib import Path

from doctor_lab.generated.combos import Combo, bug_fits, valid
from doctor_lab.generated.triage import reason_of

NAME = "generated"
FILE = "generated.json"


def _share(right: int, n: int) -> str:
    return f"{right}/{n} ({right / n:.1%})" if n else "–"


def _still_valid(c: Combo) -> bool:
    return valid(c.style) and bug_fits(c.style, c.bug)


def _said(r: dict) -> str:
    """A miss as what the doctor answered: a fail on a healthy model, a pass (or n/a) where a bug must
    show, another cause, an inconclusive, an error."""
    kind, got = r["miss"]["kind"], r["miss"]["got"]
    if kind == "false_alarm":
        return "fail on a healthy model"
    if kind == "other_cause":
        return "the right check, another cause"
    if got.startswith("inconclusive"):
        return "inconclusive"
    if kind == "error":
        return "error"
    if kind == "not_na":
        return f"{got.split(' ')[0]} where n/a was due"
    due = next((e.outcome for e in Combo.parse(r["id"]).expected.rows if e.check == r["miss"]["check"]), "fail")
    return f"{got.split(' ')[0]} where a {due} was due"


def _twins(name: str, rs: list[dict]) -> str:
    """right / another reason / same reason, over the misses of one reason that have a twin."""
    tw = [r["twin"] for r in rs if "twin" in r]
    if not tw:
        return "–"
    same = sum(1 for t in tw if not t["right"]
               and getattr(reason_of(Combo.parse(t["id"]), t["miss"]), "name", "untriaged") == name)
    right = sum(t["right"] for t in tw)
    return f"{right} right, {len(tw) - right - same} another reason, {same} same reason"


def blocks(runs, fig_dir: Path) -> dict[str, str]:
    path = Path(fig_dir).parent / "doctor" / FILE
    if not path.is_file():
        return {}
    ev = json.loads(path.read_text())
    recs = ev["combos"]
    n, right = ev["size"], ev["right"]
    healthy = [r for r in recs if r["bug"] == "healthy"]
    by_bug = defaultdict(lambda: [0, 0])
    by_value = defaultdict(lambda: [0, 0])
    grouped = defaultdict(list)
    for r in recs:
        c = Combo.parse(r["id"])
        by_bug[r["bug"]][0] += 1
        by_bug[r["bug"]][1] += r["right"]
        for val in c.style.values:
            by_value[val.key][0] += 1
            by_value[val.key][1] += r["right"]
        if not r["right"]:
            reason = reason_of(c, r["miss"])
            grouped[(reason.name, reason.whose, reason.what) if reason else ("untriaged", "?", "not looked at yet")].append(r)
    said = Counter(_said(r) for r in recs if not r["right"])
    stale = [r for r in recs if not _still_valid(Combo.parse(r["id"]))]
    whose = Counter()
    for (_, who, _), rs in grouped.items():
        whose[who] += len(rs)
    lines = [
        "## The generated styles bed: attention composed from independent axes\n",
        f"`{ev['command']}` (doctor_lab/generated/) composes small causal LMs from {len(ev['axes'])} axes "
        f"({'; '.join(f'{a}: ' + ', '.join(vs) for a, vs in ev['axes'].items())}) and plants each of "
        f"{len(ev['bugs'])} catalogue bugs where the records say it is meaningful; every expected outcome is derived "
        f"from the records (doctor_lab/generated/records.py). A healthy combination is right when no check fails "
        f"(all checks run) and the checks n/a by construction say n/a; a bug when its expected checks give the "
        f"expected outcome with one of its causes (those checks, the n/a ones and finite_output run).\n",
        f"**{n} combinations ({len(healthy)} healthy), {_share(right, n)} right**"
        + (f" (the first {n} of {ev['sample']} sampled, in the sample's shuffled order: the run stopped at its time "
           f"limit)" if n < ev["sample"] else "") + f", sampled (seed {ev['seed']}) from "
        f"{sum(ev['population'].values())} valid (style, bug) pairs; {ev['cpu_s']} s examining on "
        f"{ev['workers']} worker(s). Misses: " + (", ".join(f"{k} {v}" for k, v in whose.most_common()) or "none")
        + " (whose: after looking, the doctor's or the construction's)"
        + (f"; {len(stale)} combinations the records now rule out (a construction error fixed since the run), "
           f"{sum(r['right'] for r in stale)} of them right: without them {_share(right - sum(r['right'] for r in stale), n - len(stale))} right"
           if stale else "") + ".\n",
        "What the doctor said where it missed: " + "; ".join(f"{k} {v}" for k, v in said.most_common())
        + " (a fail on a healthy model or a pass on a bug is a wrong answer; an inconclusive is a look it could "
        "not take).\n",
        "| bug | expected rows | combinations | right |", "|---|---|---|---|",
        *(f"| {bug} | {'; '.join(ev['bugs'].get(bug, ['no fail']))} | {by_bug[bug][0]} | "
          f"{_share(by_bug[bug][1], by_bug[bug][0])} |" for bug in ["healthy", *ev["bugs"]] if by_bug[bug][0]),
        "",
        "| axis value | combinations | right |", "|---|---|---|",
        *(f"| {axis}={name} | {by_value[f'{axis}={name}'][0]} | {_share(by_value[f'{axis}={name}'][1], by_value[f'{axis}={name}'][0])} |"
          for axis, names in ev["axes"].items() for name in names),
        "",
        "Every miss, grouped by its reason (doctor_lab/generated/triage.py). twins: each miss's twin, the same "
        "combination with the values its reason blames swapped out (`python -m doctor_lab.generated --twins "
        "--out DIR`): right, missing for another reason, or missing for the same reason (the reason contradicted); "
        "– where the reason names no twin or the swap is not a valid combination.\n",
        "| reason | whose | misses | what | twins | e.g. |", "|---|---|---|---|---|---|",
    ]
    for (name, who, what), rs in sorted(grouped.items(), key=lambda kv: -len(kv[1])):
        eg = "<br>".join(f"`{r['id']}`: {r['miss']['check']} {r['miss']['got']}" for r in rs[:2])
        lines.append(f"| {name} | {who} | {len(rs)} | {what} | {_twins(name, rs)} | {eg} |")
    untriaged = grouped.get(("untriaged", "?", "not looked at yet"), [])
    if untriaged:
        lines += ["", "Untriaged misses, each:\n",
                  *(f"- `{r['id']}`: {r['miss']['kind']} {r['miss']['check']} {r['miss']['got']}" for r in untriaged)]
    lines.append("\nEvery miss is listed in results/doctor/generated.json (`combos`, `right: false`, with its row).")
    return {NAME: "\n".join(lines) + "\n"}
