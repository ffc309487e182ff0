"""The report's disk section: bytes per run dir by kind, measured from hand-made run dirs (no training)."""
import json
from pathlib import Path

from experiments import report
from experiments.report.sections import disk


def run_dir(d: Path, exp, seed, role="failure", control=None, files=None) -> Path:
    """A run dir with a summary.json and files of exact sizes."""
    d.mkdir(parents=True)
    summary = {"exp": exp, "status": "completed", "role": role, "seed": seed, "config_hash": f"{exp}{role}{seed}",
               "config": {"train": {"steps": 5}, "seed": seed, "exp": {"name": exp}},
               "verdict": {"reproduced": True, "checks": []}}
    if control is not None:
        summary["control"] = {"name": "ctl", "dir": str(control), "config_hash": f"ctlcontrol{seed}"}
    (d / "summary.json").write_text(json.dumps(summary))
    for name, n in (files or {}).items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(b"x" * n)
    return d


def test_disk_section_measures_run_dirs_by_kind_and_the_catalogue_per_seed(tmp_path):
    res = tmp_path / "results"
    for seed in (0, 1):
        c = run_dir(res / "controls" / f"ctl{seed}", "ctl", seed, role="control", files={"attn_weights.npz": 1000})
        # seed 1's control dir as run.py records it, relative to where it ran: found by its config hash
        run_dir(res / "m" / f"a{seed}", "a", seed, control=c if seed == 0 else "results/controls/ctl1",
                files={"attn_weights.npz": 3000 + 2000 * seed, "metrics.csv": 1000, "curves.png": 2000,
                       "wandb/offline-run-1/run.wandb": 4000 * seed, ".hydra/config.yaml": 100})
    # the report's own outputs, written into a run dir when the report is pointed at it, are not the run's
    (res / "m" / "a0" / "REPORT.md").write_text("y" * 10_000)
    (res / "m" / "a0" / "figures").mkdir()
    (res / "m" / "a0" / "figures" / "a.png").write_bytes(b"z" * 10_000)
    summary = (res / "m" / "a0" / "summary.json").stat().st_size
    assert disk.run_bytes(res / "m" / "a0") == {"attn_weights.npz": 3000, "metrics.csv": 1000, "curves.png": 2000,
                                                "wandb/": 0, "other": 100 + summary}

    runs = report.load_runs([res])
    md = disk.render(runs, tmp_path / "figs")
    assert "Measured from the 4 run dirs" in md
    # attn_weights.npz over the 4 dirs: 1000, 1000, 3000, 5000
    assert "| attn_weights.npz | 2.0 kB | 5.0 kB | 10.0 kB |" in md
    assert "| wandb/ | 0 B | 4.0 kB | 4.0 kB |" in md
    sizes = {r.id: sum(disk.run_bytes(r.dir).values()) for r in runs}
    assert sum(sizes.values()) == 10_000 + 2000 + 4000 + 4000 + 200 + sum(
        (p / "summary.json").stat().st_size for p in (res / "m" / "a0", res / "m" / "a1",
                                                       res / "controls" / "ctl0", res / "controls" / "ctl1"))
    per_seed = disk.catalogue_by_seed(runs, {str(r.dir): sizes[r.id] for r in runs})
    assert [(s, n, nc) for s, n, nc, _, _ in per_seed] == [(0, 1, 1), (1, 1, 1)]
    assert per_seed[1][3] == 5000 + 1000 + 2000 + 4000 + 100 + (res / "m" / "a1" / "summary.json").stat().st_size
    assert md == disk.render(report.load_runs([res]), tmp_path / "figs")  # deterministic


def test_disk_block_reaches_the_readme(tmp_path):
    res = tmp_path / "results"
    run_dir(res / "a0", "a", 0, files={"metrics.csv": 1500})
    readme = tmp_path / "README.md"
    readme.write_text("<!-- BEGIN report:disk -->\n<!-- END report:disk -->\n")
    report.build([res], res, readme)
    assert "| metrics.csv | 1.5 kB | 1.5 kB | 1.5 kB |" in readme.read_text()
