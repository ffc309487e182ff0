"""What the committed reference costs, part by part: the `reference.json` that
`python -m experiments.reference` writes beside the report (wall and CPU time, bytes written,
bytes left on disk, attempts), and its total (README block `cost_total`)."""
import json
from pathlib import Path

from experiments.report.sections.disk import size

NAME = "cost"
TITLE = "## What the reference costs"   # refresh() puts a new section before it
FILE = "reference.json"
NOT_COUNTED = ("report",)  # the report is being written from this table: it cannot time itself


def duration(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    if s < 90 * 60:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.2f} h"


def load(fig_dir: Path) -> list[tuple[str, dict]]:
    p = Path(fig_dir).parent / FILE
    if not p.exists():
        return []
    parts = json.loads(p.read_text()).get("parts", {})
    return [(n, e) for n, e in parts.items() if n not in NOT_COUNTED]


def where(parts: list[tuple[str, dict]]) -> str:
    cores = sorted({e.get("cores") for _, e in parts if e.get("cores")})
    threads = sorted({e.get("threads") for _, e in parts if e.get("threads")})
    return (f"{'/'.join(map(str, cores)) or '?'} cores, {'/'.join(map(str, threads)) or '?'} torch thread(s) "
            "per process")


def total_line(parts: list[tuple[str, dict]]) -> str:
    wall = sum(e["wall_s"] for _, e in parts)
    cpu = sum(e["cpu_s"] for _, e in parts)
    undone = [n for n, e in parts if e["status"] != "done"]
    longest = sorted(parts, key=lambda p: -p[1]["wall_s"])[:3]
    return (f"The whole reference (`python -m experiments.reference`, {len(parts)} parts, the report aside) took "
            f"**{duration(wall)}** of wall time on {where(parts)} ({duration(cpu)} of CPU time), wrote "
            f"{size(sum(e['written_bytes'] for _, e in parts))} and left "
            f"{size(sum(e['disk_bytes'] for _, e in parts))} in the results dir; the longest parts: "
            + ", ".join(f"{n} ({duration(e['wall_s'])})" for n, e in longest) + "."
            + (f" Not done: {', '.join(undone)}." if undone else ""))


def blocks(runs, fig_dir: Path) -> dict[str, str]:
    parts = load(fig_dir)
    if not parts:
        return {}
    rows = ["| part | command | status | wall | CPU | written | left on disk | attempts |",
            "|---|---|---|---|---|---|---|---|"]
    for n, e in parts:
        rows.append(f"| {n} | `{e['command'].replace('|', '/')}` | {e['status']} | {duration(e['wall_s'])} | "
                    f"{duration(e['cpu_s'])} | {size(e['written_bytes'])} | {size(e['disk_bytes'])} | "
                    f"{e['attempts']} |")
    rows.append(f"| **total** | | | **{duration(sum(e['wall_s'] for _, e in parts))}** | "
                f"{duration(sum(e['cpu_s'] for _, e in parts))} | {size(sum(e['written_bytes'] for _, e in parts))} | "
                f"{size(sum(e['disk_bytes'] for _, e in parts))} | |")
    text = (f"{TITLE}\n\n"
            f"Each part of `python -m experiments.reference` as it ended (`{FILE}` beside this report), on "
            f"{where(parts)}: wall time over all its attempts (a killed attempt counts up to its last "
            "heartbeat); CPU time of its processes (of the attempts that ran to their end); bytes written to "
            "disk (checkpoints included, though removed when a run completes); bytes it left in the results "
            "dir. Every part's command gets the results dir, a fixed dir of its own "
            "(`reference/<part>/`, where a rerun resumes) and, for `run.py`, the reference's overrides.\n\n"
            + "\n".join(rows) + "\n")  # the total follows it: the block cost_total
    return {"cost": text, "cost_total": total_line(parts) + "\n"}


def render(runs, fig_dir: Path) -> str | None:
    return blocks(runs, fig_dir).get("cost")
