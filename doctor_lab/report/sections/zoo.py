"""The zoo in the lab's report (results/DOCTOR.md): what `python -m doctor_lab.zoo` wrote
(results/zoo/zoo.json beside the report's figures dir, and results/zoo/releases/<version>/zoo.json for other releases): counts per
check, every fail and warn grouped into problems by doctor_lab/zoo/triage.yaml (one entry per
problem, its rows counted), the reruns of new findings under other conditions, the architectures
not examined, and the problems over releases with their picture and each release's cost."""
import re
from collections import Counter
from pathlib import Path

from doctor_lab.report import releases, triage

NAME = "zoo"
STATUSES = ["examined", "unsupported", "build_error", "forward_error", "doctor_target_error", "doctor_error", "timeout",
            "crash", "memory", "skipped"]
KIND_NAMES = {**triage.KINDS, "artifact": "finding that needs a random-init condition", "untriaged": "untriaged"}
PLURAL = {"finding": "new findings", "artifact": "findings that need a random-init condition",
          "false_alarm": "doctor false alarms", "known": "known behaviours", "untriaged": "untriaged"}
LIMIT_NAMES = {**triage.LIMITS, "untriaged": "untriaged"}
FIGURE = "zoo_releases.png"


def root(fig_dir: Path) -> Path:
    return Path(fig_dir).parent / "zoo"


def load(fig_dir: Path) -> dict | None:
    return current(root(fig_dir))


def current(where: Path) -> dict | None:
    """The installed release's table (where/zoo.json) or, without one, the newest release's."""
    tables = releases.load_tables(where)
    main = Path(where) / "zoo.json"
    if not tables:
        return None
    import json
    return json.loads(main.read_text()) if main.exists() else list(tables.values())[-1]


def link(thread: str) -> str:
    """owner/repo#N as a link to its GitHub thread; anything else as it is."""
    m = re.fullmatch(r"([\w.-]+/[\w.-]+)#(\d+)", thread or "")
    return f"[{thread}](https://github.com/{m[1]}/issues/{m[2]})" if m else (thread or "")


def ref(entry: dict | None) -> str:
    if not entry:
        return ""
    if entry["kind"] == "finding":
        return f"[{Path(entry['finding']).name}](../{entry['finding']})"
    return link(entry.get("thread", ""))


def blocks(runs, fig_dir: Path) -> dict[str, str]:
    """The section (`zoo`) and a line for the README (`zoo_summary`); none without zoo.json."""
    z = load(fig_dir)
    if not z:
        return {}
    return {"zoo": render_zoo(z, fig_dir), "zoo_summary": summary(z, fig_dir)}


def render(runs, fig_dir: Path) -> str | None:
    z = load(fig_dir)
    return render_zoo(z, fig_dir) if z else None


def problems(z: dict, spec: triage.Spec = triage.TRANSFORMERS) -> list[dict]:
    """The table's problems, each with its kind as the reruns show it (a finding that passed
    under a condition is an artifact of it)."""
    needs = releases.needs_of(z)
    ps = triage.problems(spec.table_flags(z), spec.entries())
    for p in ps:
        p["shown"] = releases.problem_kind(p, needs)
    return ps


def count(ps: list[dict], kind: str) -> tuple[int, int]:
    mine = [p for p in ps if p["shown"] == kind]
    return len(mine), sum(len(p["rows"]) for p in mine)


def kinds_text(ps: list[dict], sep: str) -> str:
    """'9 new findings (17 rows); 16 known behaviours (239 rows)': problems and rows per kind."""
    return sep.join(f"{n} {PLURAL[k] if n > 1 else KIND_NAMES[k]} ({rows_of(r)})"
                    for k in ("finding", "artifact", "false_alarm", "known", "untriaged") for n, r in [count(ps, k)] if n)


def count_of(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def rows_of(n: int) -> str:
    return count_of(n, "row")


def cost_text(c: dict) -> str:
    if not c:
        return "cost not recorded"
    return (f"{c['wall_s'] / 60:.1f} min wall, {c['cpu_s'] / 60:.1f} min CPU"
            + (f" over {c['sessions']} sessions" if c.get("sessions", 1) > 1 else ""))


def summary(z: dict, fig_dir: Path | None = None) -> str:
    per_impl = Counter(r["impl"] for r in z["results"] if r["status"] == "examined")
    ps = problems(z)
    rows = sum(len(p["rows"]) for p in ps)
    big = max(ps, key=lambda p: len(p["rows"]), default=None)
    line = (f"transformers {z['transformers']}: **{z['examined']} of {z['archs']}** causal-LM architectures examined ("
            + ", ".join(f"{i} {n}" for i, n in sorted(per_impl.items()))
            + f"); {rows} fail or warn {rows_of(rows)[len(str(rows)) + 1:]} from "
            f"**{count_of(len(ps), 'problem')}**: " + (kinds_text(ps, "; ") or "none") + ".")
    if big is not None and len(big["rows"]) > 1:
        e = big["entry"] or {}
        line += (f" The largest, {len(big['rows'])} rows, is one cause: {e.get('note', big['key']).split(':')[0]}"
                 + (f" ({e['thread']})" if e.get("thread") else "") + ".")
    i = inconclusive(z)
    if i["rows"]:
        line += (f" Inconclusive: {share_text(i)} ("
                 + ", ".join(f"{r} a {LIMIT_NAMES[k]}" for k, (_, r) in i["kinds"].items()) + ").")
    tables = releases.load_tables(root(fig_dir)) if fig_dir else {}
    if len(tables) > 1:
        over = releases.over_releases(tables)
        fixed = [q for q in over["problems"] if q["fixed_in"]]
        line += (f" Over {len(tables)} releases ({', '.join(tables)}): {len(over['problems'])} problems, "
                 f"{len(fixed)} fixed by a later release.")
    return line + "\n"


def _reruns(p: dict, z: dict) -> str:
    """How the problem's rows went under the other conditions (findings, false alarms, untriaged)."""
    got = {(e["arch"], e["impl"], e["check"]): e for e in z.get("confirm", [])}
    mine = [got[k] for k in ((f["arch"], f["impl"], f["check"]) for f in p["rows"]) if k in got]
    if p["kind"] == "known":
        return ""
    if not mine:
        return "**not rerun**"
    needs = sorted({n for e in mine for n in e["needs"]})
    held = sorted({c for e in mine for c, v in e["conditions"].items() if triage.outcome(v) in ("fail", "warn")})
    na = sorted({c for e in mine for c, v in e["conditions"].items()
                 if triage.outcome(v) not in ("fail", "warn", "pass")} - set(held))
    text = ("**" + "; ".join(needs) + "**" if needs else "holds") + (f" (fails under {', '.join(held)}" if held else " (")
    return text + (f"; n/a: {', '.join(na)})" if na else ")")


def verdict_table(examined: list[dict], impls: list[str], unit: str = "architectures examined with that implementation") -> list[str]:
    order = list(dict.fromkeys(c["name"] for r in examined for c in r["checks"]))
    v = Counter((c["name"], r["impl"], triage.outcome(c)) for r in examined for c in r["checks"])
    kinds = [k for k in triage.OUTCOMES if any(n == k for (_, _, n) in v)]
    out = [f"\nVerdicts per check ({unit}; {' / '.join(kinds)}):\n",
           "| check | " + " | ".join(impls) + " |\n|---|" + "---|" * len(impls)]
    out += [f"| {n} | " + " | ".join(" / ".join(str(v[(n, i, k)]) for k in kinds) for i in impls) + " |" for n in order]
    return out


def inconclusive(z: dict) -> dict:
    """The table's inconclusive rows triaged by doctor_lab/zoo/inconclusive.yaml: {rows, checks
    (the check rows of examined architectures), problems, kinds: {kind: (problems, rows)}}."""
    spec = triage.TRANSFORMERS_INCONCLUSIVE
    ps = triage.problems(spec.table_flags(z), spec.entries())
    for p in ps:
        p["shown"] = p["kind"]
    checks = sum(len(r.get("checks", [])) for r in z["results"] if r["status"] == "examined")
    kinds = {k: count(ps, k) for k in (*triage.LIMITS, "untriaged") if count(ps, k)[0]}
    return {"rows": sum(len(p["rows"]) for p in ps), "checks": checks, "problems": ps, "kinds": kinds}


def share_text(i: dict) -> str:
    """'27 of 5,055 check rows, 0.53%'."""
    return f"{i['rows']} of {i['checks']:,} check rows, {100 * i['rows'] / max(i['checks'], 1):.2f}%"


def _inconclusive(z: dict) -> list[str]:
    """Rows where a check could not look, each grouped by why: a limit of the target, of this
    machine or of the doctor (doctor_lab/zoo/inconclusive.yaml); an untriaged one loud."""
    i = inconclusive(z)
    if not i["rows"]:
        return []
    by = ", ".join(f"{LIMIT_NAMES[k]}: {n} {'problem' if n == 1 else 'problems'} ({rows_of(r)})"
                   for k, (n, r) in i["kinds"].items())
    out = [f"\n### Inconclusive ({share_text(i)})\n",
           f"Each grouped by why the check could not look (`doctor_lab/zoo/inconclusive.yaml`): {by}. A limit of the "
           "target is its nature or its source's word (the thread says where); a limit of this machine, what the "
           "target needs and this machine cannot have; a limit of the doctor, what the doctor would need to look.\n",
           "| reason | why | rows | where (architecture, implementations) | source |\n|---|---|---|---|---|"]
    for p in i["problems"]:
        e = p["entry"]
        checks = ", ".join(sorted({f["check"] for f in p["rows"]}))
        what = (f"{LIMIT_NAMES[p['kind']]} ({checks}): {e['note']}" if e else f"**untriaged** ({checks})")
        out.append(f"| {p['key']} | {what} | {len(p['rows'])} | {triage.where(p['rows'])} | {ref(e)} |")
    return out


def render_zoo(z: dict, fig_dir: Path) -> str:
    results = z["results"]
    impls = z["impls"]
    examined = [r for r in results if r["status"] == "examined"]
    out = ["## The zoo: transformers' causal LMs under the doctor\n",
           f"`python -m doctor_lab.zoo` builds each of the {z['archs']} architectures of transformers "
           f"{z['transformers']}'s `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` from a shrunk config with random weights "
           f"(no download; the generic shrink and the per-architecture entries, each with its reason, are "
           f"`doctor_lab/zoo/shrink.yaml`), runs a forward and a KV-cache step, then the doctor's checks, with "
           f"each attention implementation ({', '.join(impls)}; torch {z['torch']}, CPU), each architecture in "
           f"a process of its own. **{z['examined']} of {z['archs']}** architectures were examined with at "
           f"least one implementation. The run as a whole (imports, builds, checks, reruns): "
           f"{cost_text(z.get('cost', {}))}; the checks alone {z.get('cpu_s', 0):,.0f} CPU seconds. "
           "Of transformers' other implementations, `flex_attention` runs on CPU eagerly, torch.compile off "
           "(`--impl flex_attention` runs it; it is not in this reference: a third pass), `paged|eager` needs "
           "the continuous-batching cache, and the flash-attention kernels need CUDA.\n"]
    cnt = Counter((r["impl"], r["status"]) for r in results)
    cols = [s for s in STATUSES if any(cnt[(i, s)] for i in impls)]
    out.append("| implementation | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
    out += [f"| {i} | " + " | ".join(str(cnt[(i, s)]) for s in cols) + " |" for i in impls]
    out += verdict_table(examined, impls)
    ps = problems(z)
    rows = sum(len(p["rows"]) for p in ps)
    counts = kinds_text(ps, ", ")
    out.append(f"\n### Every fail and warn, one entry per problem\n\n{rows} fail or warn {rows_of(rows)[len(str(rows)) + 1:]}, "
               f"**{count_of(len(ps), 'problem')}**: "
               f"{counts}. A problem is one cause (`doctor_lab/zoo/triage.yaml`): a known behaviour with its public "
               "thread (or the source that says it is by design), a doctor false alarm, or a new finding with its page "
               "in `docs/findings/` (a repro outside the doctor, the cause in transformers' source, a patch, the "
               "report to file). A reason must explain what the row shows (which padding side, which implementation). "
               "Every fail or warn that is not a known behaviour is rerun with a non-zero pad embedding row (`pad_row`), "
               "pads holding ordinary token ids (`pad_id`), another seed (`seed1`), as it ran (`float32`) and in "
               "`float64`; one that passes under a condition needs what that condition takes away, and says so.\n")
    out.append("| problem | triage | rows | where (architecture, implementations) | thread or finding | reruns |\n"
               "|---|---|---|---|---|---|")
    for p in ps:
        e = p["entry"]
        what = f"{KIND_NAMES[p['shown']]}: {e['note']}" if e else f"**untriaged** ({', '.join(sorted({f['check'] for f in p['rows']}))})"
        out.append(f"| {p['key']} | {what} | {len(p['rows'])} | {triage.where(p['rows'])} | {ref(e)} | {_reruns(p, z)} |")
    out += _inconclusive(z)
    none = sorted({r["arch"] for r in examined if r.get("info", {}).get("attention_modules") == 0
                   and r.get("info", {}).get("qk_sites", 0) == 0})
    if none:
        out.append(f"\nThe doctor found no attention module in: {', '.join(none)} (state-space and recurrent "
                   "models, or a layout it does not know yet); the black-box checks apply, the white-box ones are "
                   "inconclusive.")
    ne = z.get("not_examined", {})
    if ne:
        out.append(f"\n### Not examined ({len(ne)})\n")
        out += [f"- **{a}**: " + "; ".join(reasons) for a, reasons in sorted(ne.items())]
    if z.get("not_run"):
        out.append(f"\nNot run in this reference: {', '.join(z['not_run'])}.")
    out += _over_releases(fig_dir)
    return "\n".join(out) + "\n"


def _over_releases(fig_dir: Path) -> list[str]:
    tables = releases.load_tables(root(fig_dir))
    if len(tables) < 2:
        return []
    over = releases.over_releases(tables)
    vs = over["releases"]
    draw(over, Path(fig_dir) / FIGURE, "The zoo over transformers releases: each architecture's worst row")
    return [f"\n### Across releases\n\nThe same zoo, doctor and triage on {len(vs)} transformers releases "
            f"({', '.join(vs)}), each installed on its own (`python -m doctor_lab.zoo --release VERSION --pinned DIR`, "
            "its table in `results/zoo/releases/VERSION/`); `results/zoo/releases.csv` is this table. Per problem: the "
            "first release examined that has it, and the first release after its last that no longer has it while "
            "its architectures are examined there.\n",
            f"![architectures x releases]({Path(fig_dir).name}/{FIGURE})\n", *over_releases_table(over),
            "\nWhat each release's zoo cost as a whole (imports, builds, checks, reruns; 2 CPU cores shared), and its "
            "inconclusive rows (grouped as above, each release's own):\n",
            *cost_table(over, tables=tables)]


def over_releases_table(over: dict) -> list[str]:
    """One row per problem: its triage, first release seen, the release that fixed it, rows per release."""
    vs = over["releases"]
    out = ["| problem | triage | first seen | fixed in | " + " | ".join(f"rows {v}" for v in vs) + " |\n|---|---|---|---|"
           + "---|" * len(vs)]
    for q in over["problems"]:
        out.append(f"| {q['key']} | {KIND_NAMES[q['kind']]} | {q['first_seen']} | {q['fixed_in'] or 'open'} | "
                   + " | ".join(str(releases.shown_rows(q, v)) for v in vs) + " |")
    return out


def cost_table(over: dict, unit: str = "architectures", tables: dict | None = None) -> list[str]:
    """Each release's cost; with its tables, its inconclusive rows and how many are the doctor's."""
    extra = " inconclusive | of them the doctor's |" if tables else ""
    out = [f"| release | with | {unit} | examined | wall | CPU |{extra}\n|---|---|---|---|---|---|"
           + ("---|---|" if tables else "")]
    for v, c in over["cost"].items():
        beside = ", ".join(f"{k} {x}" for k, x in sorted((c.get("with") or {}).items()) if x)
        row = (f"| {v} | {beside} | {c['archs']} | {c['examined']} | "
               + (f"{c['wall_s'] / 60:.1f} min | {c['cpu_s'] / 60:.1f} min |" if c.get("wall_s") else "not recorded | |"))
        if tables and v in tables:
            i = inconclusive(tables[v])
            row += f" {share_text(i)} | {i['kinds'].get('doctor_limit', (0, 0))[1]} |"
        out.append(row)
    return out


def draw(over: dict, path: Path, title: str) -> None:
    """Architectures x releases, each cell coloured by the worst outcome of the architecture's rows
    in that release; architectures in columns of panels so that every name is readable."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    from experiments.report.figures import plt, save
    kinds = list(releases.OUTCOMES)
    archs = sorted(over["cells"])
    vs = over["releases"]
    per = 60
    panels = max(1, -(-len(archs) // per))
    fig, axes = plt.subplots(1, panels, figsize=(2.3 * panels + 1.0, 0.14 * min(per, len(archs)) + 2.2), squeeze=False)
    cmap = ListedColormap([releases.OUTCOMES[k][1] for k in kinds])
    for j, ax in enumerate(axes[0]):
        mine = archs[j * per:(j + 1) * per]
        grid = [[kinds.index(over["cells"][a][v]) for v in vs] for a in mine]
        grid += [[kinds.index("absent")] * len(vs)] * (per - len(mine))
        ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=len(kinds) - 0.5, aspect="auto", interpolation="nearest")
        ax.set_yticks(range(len(mine)), mine, fontsize=5)
        ax.set_xticks(range(len(vs)), vs, fontsize=6, rotation=90)
        ax.set_xticks([x - 0.5 for x in range(1, len(vs))], minor=True)
        ax.grid(which="minor", axis="x", color="white", linewidth=0.8)
        ax.tick_params(length=0)
    fig.legend(handles=[Patch(facecolor=releases.OUTCOMES[k][1], edgecolor="grey", label=releases.OUTCOMES[k][0])
                        for k in kinds], loc="lower center", ncol=3, fontsize=6, frameon=False)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 0.97))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save(fig, path)
