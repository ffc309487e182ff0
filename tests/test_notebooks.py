"""The notebooks execute top to bottom (nbmake), each in well under a minute. 02_results is
pointed at an empty results dir, so it takes the fresh-clone path (trains its tiny demo)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_the_notebooks_exist():
    assert [p.name for p in NOTEBOOKS] == ["01_attention_from_the_formula.ipynb", "02_results.ipynb"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(notebook, tmp_path):
    env = {**os.environ, "ATTN_RESULTS": str(tmp_path / "empty"), "WANDB_MODE": "disabled",
           "MPLBACKEND": "Agg"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbmake",
                        "--nbmake-timeout=120", str(notebook)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]


def test_the_results_notebook_asserts_what_it_shows():
    """Each code cell of 02_results that shows something checks it (issue 35): executing it is a test."""
    import json
    cells = [c for c in json.loads((ROOT / "notebooks" / "02_results.ipynb").read_text())["cells"]
             if c["cell_type"] == "code"]
    shown = [c for c in cells if any(w in "".join(c["source"]) for w in ("display(", "plt.", ".plot(", "runs_table"))]
    assert shown and all("assert " in "".join(c["source"]) for c in shown)
