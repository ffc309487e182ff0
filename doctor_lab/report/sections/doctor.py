"""The attention doctor's evidence: results/doctor/*.json, written by
`python -m doctor_lab.validation all` (beside the lab report's figures dir). Three blocks:
`doctor` (what it is and a real run on a buggy target), `doctor_summary` (the README's: that run
with its notes folded) and
`doctor_evidence` (sensitivity on the catalogue, the test bed of styles, specificity on real code,
the public reference implementations, shipped bugs caught in pinned releases, the stability benchmark
(stability.json, `python -m doctor_lab.stability --out`), the benchmark)."""
import json
import re
from pathlib import Path

from attention_doctor.checks import REGISTRY
from attention_doctor.result import FAIL, INCONCLUSIVE, NA, RAN, WARN, Row
from doctor_lab.report.stability import exit_codes, flips, totals

NAME = "doctor"
SHORT = {c.name: c.short for c in REGISTRY}   # the label on each check's record


def _load(fig_dir: Path) -> dict:
    d = Path(fig_dir).parent / "doctor"
    return {p.stem: json.loads(p.read_text()) for p in sorted(d.glob("*.json"))} if d.is_dir() else {}


def _rows(result: dict) -> dict[str, Row]:
    """{check: Row} of a result's JSON, read by the doctor's one parser (this schema or the older)."""
    return {c["name"]: Row.from_dict(c) for c in result["checks"]}


def _cell(row: Row, targeted: bool) -> str:
    v = {"inconclusive": "inconcl."}.get(row.outcome.value, row.outcome.value)
    return f"**{v}**" if targeted else {"pass": "pass", "n/a": "–"}.get(v, v)


def sensitivity(s: dict) -> str:
    names = [c["name"] for c in s["rows"][0]["result"]["checks"]]
    head = "| experiment (failure value) | " + " | ".join(SHORT.get(n, n) for n in names) + " | control: targeted |"
    lines = [head, "|" + "---|" * (len(names) + 2)]
    missed, untargeted, alike = [], [], []
    for r in s["rows"]:
        v = _rows(r["result"])
        t = set(r["targets"])
        ctl = ", ".join(f"{SHORT.get(c, c)} {_cell(_rows(r['control'])[c], False)}" for c in r["targets"]) \
            if r.get("control") and r["targets"] else "–"
        cell = lambda n: _cell(v[n], n in t) + (f" ({v[n].cause})" if n in t and v[n].cause else "")  # noqa: E731
        lines.append(f"| `{r['exp']}` | " + " | ".join(cell(n) for n in names) + f" | {ctl} |")
        missed += [f"{r['exp']}/{c}" for c in r["targets"] if v[c].outcome not in (FAIL, WARN)]
        if r.get("control"):   # flagged, but by a cause its control shares: the value itself is not told apart
            vc = _rows(r["control"])
            alike += [f"{r['exp']}/{c} ({v[c].cause})" for c in r["targets"]
                      if v[c].outcome is vc[c].outcome is FAIL and v[c].cause == vc[c].cause]
        if not t and r["exp"] != "baseline":
            untargeted.append(r)
    out = [f"Each row is this project's LM with one catalogue experiment's failure value "
           f"(`attention-doctor self:+exp=NAME`), the healthy baseline first; bold: the checks "
           f"that target that value, with the cause a fail names; –: n/a; the last column: the same checks on the "
           f"experiment's control (the value fixed). Targeted checks that did not flag their failure value: "
           f"{', '.join(missed) if missed else 'none'}. Flagged only by a cause the control shares (the failure "
           f"value itself not told apart): {', '.join(alike) if alike else 'none'}.", "", *lines, ""]
    notes = [f"- `{r['exp']}`: {r['control_note']}" for r in s["rows"] if r.get("control_note")]
    if notes:
        out += ["Controls on which a targeted check does not pass:\n", *notes, ""]
    if untargeted:
        out.append("Catalogue failures no check targets, and why:\n")
        out += [f"- `{r['exp']}` ({r['broken']}): {r.get('not_detected') or 'no reason recorded'}" for r in untargeted]
    return "\n".join(out) + "\n"


def specificity(s: dict) -> str:
    env = s.get("env", {})
    lines = ["| library | variant | not passed (n/a left out) |", "|---|---|---|"]
    notes, unexplained = {}, []
    for r in s["rows"]:
        bad = [f"{f['check']}: {Row.from_dict({'name': f['check'], **f}).outcome}" + (f" ({f['cause']})" if f.get("cause") else "")
               for f in r["findings"]]
        lines.append(f"| {r['library']} | {r['variant']} | {', '.join(bad) if bad else 'nothing'} |")
        for f in r["findings"]:
            if f["explained"]:
                notes[(r["library"], f["check"])] = f["explained"]
            else:
                unexplained.append(f"{r['library']} {r['variant']}: {f['check']}")
    out = [f"Real code, unchanged (torch {env.get('torch')}, transformers {env.get('transformers')}), "
           "tried as a new user would. Every finding, with its public thread:", "", *lines, ""]
    out += [f"- **{lib}, {check}**: {text}" for (lib, check), text in notes.items()]
    out.append(f"\nFindings without an explanation (a doctor bug until shown otherwise): "
               f"{'; '.join(unexplained) if unexplained else 'none'}.")
    return "\n".join(out) + "\n"


def _ran(result: dict) -> int:
    """Checks that reached a verdict (the count the doctor's info carries; older JSON: counted)."""
    info = result.get("info", {})
    return info.get("checks_run", sum(r.outcome in RAN for r in _rows(result).values()))


def styles(s: dict) -> str:
    """Sensitivity per style: each catalogue bug's targeted checks in each notation, and the checks
    each style's healthy model ran."""
    names = s["styles"]
    by = {(r["style"], r["bug"]): r for r in s["rows"]}
    bugs = list(dict.fromkeys(r["bug"] for r in s["rows"] if r["bug"]))
    lines = ["| bug (targeted checks) | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    healthy = []
    for st in names:
        r = by[(st, None)]
        bad = [f"{n} {c.verdict}" for n, c in _rows(r["result"]).items() if c.outcome in (FAIL, WARN)]
        healthy.append(f"{_ran(r['result'])} of {len(r['result']['checks'])} run" + (f"; {', '.join(bad)}" if bad else ""))
    lines.append("| healthy: checks run; not passed | " + " | ".join(healthy) + " |")
    missed, caught, total = [], 0, 0
    for b in bugs:
        cells = []
        for st in names:
            r = by.get((st, b))
            if r is None:
                cells.append("–")
                continue
            v = _rows(r["result"])
            want = WARN if r["warn"] else FAIL
            got = [v[c].verdict for c in r["targets"]]
            ok = all(v[c].outcome is want for c in r["targets"])
            caught, total = caught + ok, total + 1
            if not ok:
                missed.append(f"{st}/{b}")
            cells.append(("**" + "/".join(got) + "**") if ok else "/".join(x[:25] for x in got))
        lines.append(f"| `{b}` ({', '.join(SHORT.get(c, c) for c in by[next(k for k in by if k[1] == b)]['targets'])}) | "
                     + " | ".join(cells) + " |")
    return ("The test bed (doctor_lab/styles/classic.py): small causal LMs written here in four notations, each "
            "healthy and with every catalogue bug its notation can express; a cell is the targeted checks' "
            f"verdicts (–: the notation cannot express that bug). Caught: {caught} of {total}; missed: "
            f"{', '.join(missed) if missed else 'none'}.\n\n" + "\n".join(lines) + "\n")


def references(s: dict) -> str:
    """Per public reference implementation: its source, the checks run, each fail or warn with its
    explanation, each check that did not run with the doctor's reason and what the code lacks."""
    lines = ["| target | code | checks run | not passed (explained) |", "|---|---|---|---|"]
    notes, unexplained = [], []
    for r in s["rows"]:
        if "error" in r:
            lines.append(f"| {r['name']} | – | error: {r['error']} | |")
            continue
        p = r["provenance"]
        code = p.get("release") or f"{p['repo']} @ {p['commit'][:12]}" + (" (file changed)" if p.get("file_changed") else "")
        res = r["result"]
        bad = []
        for c in _rows(res).values():
            if c.outcome in (FAIL, WARN):
                why = r["findings"].get(c.name)
                bad.append(f"{c.name} {c.verdict}" + ("" if why else " (UNEXPLAINED)"))
                if why:
                    notes.append(f"- **{r['name']}, {c.name}**: {why}")
                else:
                    unexplained.append(f"{r['name']}: {c.name}")
            elif c.outcome is INCONCLUSIVE:   # the doctor could not look: never explained away
                notes.append(f"- {r['name']}, {c.name}: {c.verdict}")
                unexplained.append(f"{r['name']}: {c.name} inconclusive")
            elif c.outcome is NA:
                nature = r["by_nature"].get(c.name)
                notes.append(f"- {r['name']}, {c.name} did not run: {nature or 'NOT BY NATURE'} (the doctor: "
                             f"\"{c.verdict}\")")
                if not nature:
                    unexplained.append(f"{r['name']}: {c.name} did not run")
        lines.append(f"| {r['name']} | {code} | {_ran(res)} of {len(res['checks'])} | {', '.join(bad) or 'nothing'} |")
    return ("The public reference implementations, each built small from its own source (a release installed "
            "in a directory of its own, or the clone the user names; never copied here: "
            "`python -m doctor_lab.validation references --source NAME=PATH ...`), examined as they are "
            "(the Annotated Transformer, an encoder-decoder, through an adapter). Every fail and warn, with its "
            "explanation, and every check that did not run, with what the code lacks:\n\n" + "\n".join(lines)
            + "\n\n" + "\n".join(notes) + f"\n\nUnexplained: {'; '.join(unexplained) if unexplained else 'none'}.\n")


def _shipped_cell(row, which):
    r = row.get(which + "_result", {})
    if "error" in r:
        return f"error: {r['error']}"
    c = _rows(r).get(row["check"])
    if c is None:
        return f"{row.get(which + '_version', row[which])}: ?"
    if c.outcome is INCONCLUSIVE:
        return f"{row.get(which + '_version', row[which])}: **inconclusive** ({c.cause or c.verdict})"
    m = c.measured
    m = f" ({m:.3g})" if isinstance(m, (int, float)) else ""
    return f"{row.get(which + '_version', row[which])}: **{c.verdict}**{m}"


def shipped(s: dict) -> str:
    lines = ["| bug | check | buggy release | fixing release | thread |", "|---|---|---|---|---|"]
    for r in s["rows"]:
        lines.append(f"| {r['bug']} | {r['check']} | {r['package']} {_shipped_cell(r, 'buggy')} | "
                     f"{r['package']} {_shipped_cell(r, 'fixed')} | {r['thread']} |")
    tried = [f"- {k}: {v}" for k, v in s.get("not_used", {}).items()]
    return ("Pinned releases of public libraries with a known, shipped attention bug, each installed in a "
            "directory of its own (`PINNED` in doctor_lab/validation.py has the commands), against the "
            "release that fixed it "
            "(the check's verdict and what it measured, against the tolerance in docs/doctor.md):\n\n"
            + "\n".join(lines) + "\n\nAlso tried, and why they are not in the table:\n\n" + "\n".join(tried) + "\n")


def benchmark(b: dict) -> str:
    rows = "; ".join(f"{r['target']}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU" for r in b["rows"])
    return (f"All {len(b['rows'][0]['per_check_s'])} checks, {b['rows'][0]['threads']} torch threads ({b.get('machine', '')}): {rows} "
            "(target: under 30 s; `python -m doctor_lab.validation benchmark`).\n")


def stability(s: dict) -> str:
    """The stability benchmark (python -m doctor_lab.stability --out): flips and exit codes per bed."""
    runs, beds = s["runs"], s["beds"]
    f = flips(runs)
    by_bed: dict[str, list[str]] = {}
    for name in runs[0]:
        by_bed.setdefault(beds.get(name, "?"), []).append(name)
    lines = ["| bed | healthy targets | flips | exit codes seen | without their documented hazards |", "|---|---|---|---|---|"]
    for bed, names in by_bed.items():
        codes = sorted({c for n in names for c in exit_codes(runs, n)}, key=str)
        bare = sorted({c for n in names for c in exit_codes(runs, n, "bare_exit_code")}, key=str)
        lines.append(f"| {bed} | {len(names)} | {sum(sum(f[n].values()) for n in names)} | "
                     f"{', '.join(map(str, codes))} | {', '.join(map(str, bare))} |")
    total, checks, off = totals(runs)
    hazard = [f"{n} fails " + ", ".join(f"{c} ({row[1]})" for c, row in runs[0][n].get("rows", {}).items() if row[0] == "fail")
              for n in runs[0] if exit_codes(runs, n) != exit_codes(runs, n, "bare_exit_code")]
    moved = [f"{n} ({', '.join(f'{c} {k}' for c, k in v.items() if k)})" for n, v in f.items() if sum(v.values())]
    load = s.get("load") or []
    text = (f"`{s['command']}` on the doctor {s['doctor']}: {len(runs[0])} healthy targets of the test beds, each "
            f"examined {len(runs)} times, each run a process of its own as a CI job is, beside {s['busy']} CPU-spinning "
            f"processes on {s['cpus']} CPUs" + (f" (the 1-minute load average at the runs' ends {min(load):.1f} to "
                                               f"{max(load):.1f})" if load else "")
            + f", {s['wall_s'] / 60:.0f} min wall. **{total} outcome flips** over {checks} target-checks (a run whose "
            f"outcome or cause of a check differs from the first run's), **{off} target-runs exited other than 0 or 3**. "
            "Exit codes as a maintainer's CI judges them, against the hazards each bed documents for its formula as a "
            "baseline" + (f" ({'; '.join(hazard)}: by its formula, as its bed documents; the bare exit codes in the last "
                          "column)" if hazard else "") + ".\n")
    return text + "\n" + "\n".join(lines) + "\n" + (f"\nFlipped: {'; '.join(moved)}.\n" if moved else "")


def _run(e: dict, stdout: str) -> str:
    return f"```text\n$ {e['command']}\n{stdout.rstrip()}\n$ echo $?\n{e['exit_code']}\n```\n"


NOTE = re.compile(r"^\[(\d+)\] ")


def _notes_folded(stdout: str) -> str:
    """The doctor's output with its numbered notes (each check's tolerance, reproduce command and
    thread, below the table) folded into one line that says where they are: the README's block
    fits its page."""
    out, folded, done = [], [], False
    for line in stdout.splitlines():
        m = None if done else NOTE.match(line)
        if m:
            folded.append(m.group(1))
        elif folded and not done and line.startswith(" "):   # a note's continuation
            continue
        else:
            if folded and not done:
                out.append(f"[notes {folded[0]}-{folded[-1]}: each check's tolerance, reproduce command and thread; "
                           "in full in results/DOCTOR.md]")
                done = True
            out.append(line)
    return "\n".join(out)


def blocks(runs, fig_dir: Path) -> dict[str, str]:
    d = _load(fig_dir)
    if not d:
        return {}
    intro = ["## The attention doctor\n",
             "`attention-doctor TARGET` (or `python -m attention_doctor TARGET`) looks for the catalogue's bugs in any "
             "attention: a module or an Adapter, a transformers model (`hf:llama`), this project's LM (`self:`); "
             "each check of docs/doctor.md against a healthy reference. Outcomes: `pass`; `fail`, with its cause; "
             "`warn` (it held only with what the caller must pass); `n/a: why`; `inconclusive: why` (the doctor "
             "could not look: never a pass). Exit codes: 0 every applicable check held, 1 a check failed, 2 the "
             "target or an optional dependency is unusable (one line naming the fix), 3 nothing failed but a check "
             "was inconclusive. A real run on a buggy target:\n"]
    short = list(intro)
    if "example" in d:
        e = d["example"]
        intro.append(_run(e, e["stdout"]))
        short.append(_run(e, _notes_folded(e["stdout"])))
    ev = []
    if "sensitivity" in d:
        ev += ["### Sensitivity: the catalogue's failure values\n", sensitivity(d["sensitivity"])]
    if "styles" in d:
        ev += ["### Styles: the same bugs in other notations\n", styles(d["styles"])]
    if "specificity" in d:
        ev += ["### Specificity: real code\n", specificity(d["specificity"])]
    if "references" in d:
        ev += ["### The public reference implementations\n", references(d["references"])]
    if "shipped" in d:
        ev += ["### Shipped bugs caught in pinned releases\n", shipped(d["shipped"])]
    if "stability" in d:
        ev += ["### Stability: the gate under load\n", stability(d["stability"])]
    if "benchmark" in d:
        ev += ["### Cost\n", benchmark(d["benchmark"])]
    out = {"doctor": "\n".join(intro), "doctor_summary": "\n".join(short[1:])}   # the README's: no heading, notes folded
    if ev:
        out["doctor_evidence"] = "\n".join(ev)
    return out
