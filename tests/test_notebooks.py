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
