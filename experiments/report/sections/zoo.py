"""The zoo in the report: what `python -m experiments.zoo --out <report dir>/zoo` wrote
(zoo.json beside the report's figures dir): counts per check, every fail and warn with its
triage (experiments/zoo/triage.yaml), and the architectures not examined with the reason."""
import fnmatch
import json
import re
from collections import Counter
from pathlib import Path

import yaml

NAME = "zoo"
TRIAGE = Path(__file__).resolve().parents[2] / "zoo" / "triage.yaml"
OUTCOMES = ["pass", "fail", "warn", "n/a", "inconclusive"]   # attention_doctor.result.OUTCOMES
STATUSES = ["examined", "unsupported", "build_error", "forward_error", "doctor_target_error", "doctor_error", "timeout",
            "crash", "memory", "skipped"]
KINDS = {"known": "known behaviour", "false_alarm": "doctor false alarm", "finding": "new finding"}


def load(fig_dir: Path) -> dict | None:
    p = Path(fig_dir).parent / "zoo" / "zoo.json"
    return json.loads(p.read_text()) if p.exists() else None


def load_triage(path=TRIAGE) -> list[dict]:
    return yaml.safe_load(Path(path).read_text()) or [] if Path(path).exists() else []


def _matches(e: dict, arch: str, impl: str, check: str, verdict: str) -> bool:
    checks = e["check"] if isinstance(e["check"], list) else [e["check"]]
    return (any(fnmatch.fnmatchcase(check, c) for c in checks) and e.get("verdict", verdict) == verdict
            and e.get("impl", impl) in (impl, "*")
            and any(fnmatch.fnmatchcase(arch, pat) for pat in e.get("archs", ["*"])))


def triage(flags: list[tuple], entries: list[dict]) -> dict[int, list[tuple]]:
    """flag (arch, impl, check, verdict, measured) -> the index of the first entry that matches
    it (-1: untriaged)."""
    out: dict[int, list[tuple]] = {}
    for f in flags:
        i = next((i for i, e in enumerate(entries) if _matches(e, *f[:4])), -1)
        out.setdefault(i, []).append(f)
    return out


def link(thread: str) -> str:
    """owner/repo#N as a link to its GitHub thread; anything else as it is."""
    m = re.fullmatch(r"([\w.-]+/[\w.-]+)#(\d+)", thread or "")
    return f"[{thread}](https://github.com/{m[1]}/issues/{m[2]})" if m else (thread or "")


def _where(flags: list[tuple]) -> str:
    by_arch: dict[str, list[str]] = {}
    for arch, impl, *_ in flags:
        by_arch.setdefault(arch, []).append(impl)
    return ", ".join(f"{a} ({'+'.join(sorted(i))})" for a, i in sorted(by_arch.items()))


def blocks(runs, fig_dir: Path) -> dict[str, str]:
    """The section (`zoo`) and a line for the README (`zoo_summary`); none without zoo.json."""
    z = load(fig_dir)
    if not z:
        return {}
    return {"zoo": render_zoo(z), "zoo_summary": summary(z)}


def render(runs, fig_dir: Path) -> str | None:
    z = load(fig_dir)
    return render_zoo(z) if z else None


def _flags(z: dict) -> list[tuple]:
    return [(r["arch"], r["impl"], c["name"], c["verdict"], c.get("measured"))
            for r in z["results"] if r["status"] == "examined" for c in r["checks"]
            if c["verdict"] in ("fail", "warn")]


def summary(z: dict) -> str:
    per_impl = Counter(r["impl"] for r in z["results"] if r["status"] == "examined")
    flags = _flags(z)
    entries = load_triage()
    groups = triage(flags, entries)
    kinds = Counter()
    for i, fl in groups.items():
        kinds[entries[i]["kind"] if i >= 0 else "untriaged"] += len(fl)
    tri = ", ".join(f"{kinds[k]} {KINDS.get(k, k)}" for k in [*KINDS, "untriaged"] if kinds[k])
    return (f"transformers {z['transformers']}: **{z['examined']} of {z['archs']}** causal-LM architectures "
            f"examined (" + ", ".join(f"{i} {n}" for i, n in sorted(per_impl.items())) + f"); {len(flags)} fail "
            f"or warn rows, triaged: {tri or 'none'}.\n")


def render_zoo(z: dict) -> str:
    results = z["results"]
    impls = z["impls"]
    examined = [r for r in results if r["status"] == "examined"]
    out = ["## The zoo: transformers' causal LMs under the doctor\n",
           f"`python -m experiments.zoo` builds each of the {z['archs']} architectures of transformers "
           f"{z['transformers']}'s `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` from a shrunk config with random weights "
           f"(no download; the generic shrink and the per-architecture entries, each with its reason, are "
           f"`experiments/zoo/shrink.yaml`), runs a forward and a KV-cache step, then the doctor's checks, with "
           f"each attention implementation ({', '.join(impls)}; torch {z['torch']}, CPU), each architecture in "
           f"a process of its own. **{z['examined']} of {z['archs']}** architectures were examined with at "
           f"least one implementation; {sum(r.get('cpu_s', 0) for r in results):,.0f} CPU seconds in all. "
           "Of transformers' other implementations, `flex_attention` runs on CPU but compiles for every new "
           "input shape (`--impl flex_attention` runs it; it is not in this reference), `paged|eager` needs "
           "the continuous-batching cache, and the flash-attention kernels need CUDA.\n"]
    # outcomes
    cnt = Counter((r["impl"], r["status"]) for r in results)
    cols = [s for s in STATUSES if any(cnt[(i, s)] for i in impls)]
    out.append("| implementation | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
    out += [f"| {i} | " + " | ".join(str(cnt[(i, s)]) for s in cols) + " |" for i in impls]
    # verdicts per check
    order = [c["name"] for c in examined[0]["checks"]] if examined else []
    v = Counter()
    for r in examined:
        for c in r["checks"]:
            v[(c["name"], r["impl"], c["verdict"].split(":", 1)[0])] += 1
    # the doctor's outcomes, and any other a results file holds (an older doctor's `skip`)
    kinds = OUTCOMES + sorted({k for _, _, k in v} - set(OUTCOMES))
    out.append(f"\nVerdicts per check (architectures examined with that implementation; {' / '.join(kinds)}):\n")
    out.append("| check | " + " | ".join(impls) + " |\n|---|" + "---|" * len(impls))
    out += [f"| {n} | " + " | ".join(" / ".join(str(v[(n, i, k)]) for k in kinds) for i in impls) + " |"
            for n in order]
    # triage
    flags = _flags(z)
    entries = load_triage()
    groups = triage(flags, entries)
    out.append(f"\n### Every fail and warn, triaged\n\n{len(flags)} fail or warn rows. Each is a known "
               "behaviour with its public thread, a doctor false alarm (noted for the doctor; the row reruns once it "
               "is fixed), "
               "or a new finding with a reproduction outside the doctor (`docs/findings/`); "
               "the triage is `experiments/zoo/triage.yaml`.\n")
    out.append("| check | verdict | triage | where (architecture, implementations) | thread or finding |\n"
               "|---|---|---|---|---|")
    for i in sorted(groups, key=lambda i: (i < 0, i)):
        fl = groups[i]
        for (check, verdict) in sorted({(f[2], f[3]) for f in fl}):
            sub = [f for f in fl if (f[2], f[3]) == (check, verdict)]
            if i < 0:
                out.append(f"| {check} | {verdict} | **untriaged** | {_where(sub)} | |")
            else:
                e = entries[i]
                ref = (link(e.get("thread", "")) if e["kind"] != "finding"
                       else f"[{Path(e['finding']).name}](../{e['finding']})")
                out.append(f"| {check} | {verdict} | {KINDS[e['kind']]}: {e['note']} | {_where(sub)} | {ref} |")
    # no attention seen: the black-box checks still apply, the white-box ones are inconclusive
    none = sorted({r["arch"] for r in examined if r.get("info", {}).get("attention_modules") == 0
                   and r.get("info", {}).get("qk_sites", 0) == 0})
    if none:
        out.append(f"\nThe doctor found no attention module in: {', '.join(none)} (state-space and recurrent "
                   "models, or a layout it does not know yet); the black-box checks apply, the white-box ones are "
                   "inconclusive.")
    # not examined
    ne = z.get("not_examined", {})
    if ne:
        out.append(f"\n### Not examined ({len(ne)})\n")
        out += [f"- **{a}**: " + "; ".join(reasons) for a, reasons in sorted(ne.items())]
    if z.get("not_run"):
        out.append(f"\nNot run in this reference: {', '.join(z['not_run'])}.")
    return "\n".join(out) + "\n"
