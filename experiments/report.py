"""The report: every run found, one tidy table, REPORT.md with the catalogue and the sections.

    python -m experiments.report                       # results/ -> results/REPORT.md, runs.csv, figures/
    python -m experiments.report results/multirun/X    # one sweep, written into that dir
    python -m experiments.report --readme README.md    # also refresh README's report blocks

Deterministic: the same run dirs give the same REPORT.md, byte for byte (no timestamps, no
absolute paths), so the committed reference can be regenerated and diffed.
README blocks: the text between `<!-- BEGIN report:NAME -->` and `<!-- END report:NAME -->` is
replaced by the report block NAME (`catalogue`, `per_seed`, `figure:<exp>`, or a section's NAME).
"""
import argparse
import json
import os
import re
import sys
import traceback
from pathlib import Path

import pandas as pd

from experiments import sections
from experiments.io import atomic_write, write_text
from experiments.runner import config_hash

STAMP = re.compile(r"\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}(?:-\d+)?")
SKIP_PARTS = ("wandb", "checkpoints", "figures")


def _display(path: Path) -> str:
    """A path as the report shows it: relative to the working directory when it lies below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def variant(summary: dict) -> str:
    """What was trained, seed aside: runs of one variant differ only by seed."""
    cfg = dict(summary.get("config") or {})
    if not cfg.get("train"):
        return summary.get("config_hash", "")
    cfg["seed"] = None
    return config_hash(cfg)


def _summary_files(d: Path):
    for p in sorted(Path(d).rglob("summary.json")):
        rel = p.relative_to(d).parts[:-1]
        if any(part.startswith(".") or part in SKIP_PARTS for part in rel):
            continue
        yield p


def _read(path: Path) -> dict | None:
    try:
        s = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        print(f"report: skipping {path}: {e}", file=sys.stderr)
        return None
    s["_dir"] = path.parent
    s["_id"] = _display(path.parent)
    s["_variant"] = variant(s)
    return s


def load_summaries(dirs) -> list[dict]:
    """Every run under `dirs` and the control of each, newest run per (exp, role, config).
    Each summary gets `_dir`, `_id` (display path), `_variant`, and `_control` (its control's
    summary, or None)."""
    found = [s for d in dirs for p in _summary_files(Path(d)) if (s := _read(p))]
    for s in list(found):
        cdir = (s.get("control") or {}).get("dir")
        if cdir and (Path(cdir) / "summary.json").exists():
            found.append(_read(Path(cdir) / "summary.json"))
    latest: dict = {}
    for s in found:
        key = (s["exp"], s.get("role"), s.get("config_hash") or s["_id"])
        stamp = (STAMP.findall(str(s["_dir"])) or [""])[-1]
        rank = (stamp, str(s["_dir"]))
        if key not in latest or rank > latest[key][0]:
            latest[key] = (rank, s)
    out = sorted((s for _, s in latest.values()),
                 key=lambda s: (s["exp"], s.get("role") == "control", s["_variant"], s.get("seed", 0), s["_id"]))
    by_dir = {Path(s["_dir"]).resolve(): s for s in out}
    for s in out:
        cdir = (s.get("control") or {}).get("dir")
        s["_control"] = by_dir.get(Path(cdir).resolve()) if cdir else None
    return out


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, list):
            out[key] = json.dumps(v)
        else:
            out[key] = v
    return out


def runs_table(summaries: list[dict]) -> pd.DataFrame:
    """Tidy: one row per run and logged step; run fields and config fields as columns, then
    the metrics (slash names, as in metrics.csv and W&B)."""
    frames = []
    for s in summaries:
        m = sections.metrics(s)
        if m.empty:
            m = pd.DataFrame({"step": [None]})
        cfg = {k: v for k, v in flatten(s.get("config") or {}).items()
               if not k.startswith("exp.") or k == "exp.name"}
        meta = {"run": s["_id"], "exp": s["exp"], "role": s.get("role"), "seed": s.get("seed"),
                "status": s.get("status"), "reproduced": (s.get("verdict") or {}).get("reproduced"),
                "variant": s["_variant"], **{f"config.{k}": v for k, v in cfg.items()}}
        meta_df = pd.DataFrame({k: [v] * len(m) for k, v in meta.items()}, index=m.index)
        frames.append(pd.concat([meta_df, m], axis=1))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# -- assembly ------------------------------------------------------------------------------------

def render_blocks(summaries: list[dict], fig_dir: Path) -> dict[str, str]:
    """Every section's markdown blocks, in report order. A section that raises is reported as
    failed (with the reason) instead of taking the whole report down."""
    blocks: dict[str, str] = {}
    for mod in sections.discover():
        try:
            if hasattr(mod, "blocks"):
                blocks.update(mod.blocks(summaries, fig_dir))
            else:
                md = mod.render(summaries, fig_dir)
                if md:
                    blocks[mod.NAME] = md
        except Exception as e:
            traceback.print_exc()
            blocks[mod.NAME] = f"## {mod.NAME}\n\nThis section failed to render: `{type(e).__name__}: {e}`\n"
    return blocks


def header(summaries: list[dict]) -> str:
    primary = [s for s in summaries if s.get("role") != "control"]
    exps = sorted({s["exp"] for s in primary})
    devices = sorted({s["device"] for s in summaries if s.get("device")}) or ["unknown"]
    return ("# Attention failure suite: report\n\n"
            f"{len(primary)} runs of {len(exps)} experiments, "
            f"{len(summaries) - len(primary)} control run(s); device: {', '.join(devices)}. "
            "Generated by `python -m experiments.report` from the runs' own summary.json and "
            "metrics.csv; `runs.csv` beside this file holds every logged step.\n")


def update_readme(readme: Path, blocks: dict[str, str], out: Path) -> list[str]:
    """Replace each marked block; figure links are rewritten relative to the README.
    Returns the names of markers with no block to fill (left as they were)."""
    text = readme.read_text()
    prefix = os.path.relpath(Path(out).resolve(), Path(readme).resolve().parent).replace(os.sep, "/")
    missing = []

    def fill(m):
        name = m.group(1)
        if name not in blocks:
            missing.append(name)
            return m.group(0)
        body = blocks[name].replace("](figures/", f"]({prefix}/figures/")
        return f"<!-- BEGIN report:{name} -->\n{body.strip()}\n<!-- END report:{name} -->"
    new = re.sub(r"<!-- BEGIN report:(\S+) -->.*?<!-- END report:\1 -->", fill, text, flags=re.S)
    if new != text:
        write_text(readme, new)
    return missing


def build(dirs, out: Path, readme: Path | None = None) -> Path:
    out = Path(out)
    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    before = {p: p.stat().st_mtime_ns for p in fig_dir.glob("*.png")}
    summaries = load_summaries(dirs)
    table = runs_table(summaries)
    if not table.empty:
        atomic_write(out / "runs.csv", lambda f: table.to_csv(f, index=False, lineterminator="\n"))
    if summaries:
        blocks = render_blocks(summaries, fig_dir)
        text = header(summaries) + "".join(f"\n{b.strip()}\n" for b in blocks.values())
    else:
        blocks = {}
        text = "# Attention failure suite: report\n\nNo runs found.\n"
    write_text(out / "REPORT.md", text)
    # figures this report did not (re)write are stale: a regenerated report has exactly its own
    for p, mtime in before.items():
        if p.exists() and p.stat().st_mtime_ns == mtime:
            p.unlink()
    if readme is not None:
        for name in update_readme(Path(readme), blocks, out):
            print(f"report: README marker report:{name} has no block (known: {', '.join(blocks)})",
                  file=sys.stderr)
    return out / "REPORT.md"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.report", description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="*", type=Path, help="run, sweep or results dirs (default: results)")
    ap.add_argument("--out", type=Path, help="where REPORT.md, runs.csv, figures/ go "
                                             "(default: the only DIR given, else results)")
    ap.add_argument("--readme", type=Path, help="refresh this README's <!-- BEGIN report:NAME --> blocks")
    a = ap.parse_args(argv)
    dirs = a.dirs or [Path("results")]
    for d in dirs:
        if not d.is_dir():
            print(f"error: {d} is not a directory", file=sys.stderr)
            return 2
    if a.readme is not None and not a.readme.is_file():
        print(f"error: --readme {a.readme} does not exist", file=sys.stderr)
        return 2
    out = a.out or (dirs[0] if len(dirs) == 1 else Path("results"))
    path = build(dirs, out, a.readme)
    print(f"report: {_display(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
