import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("MPLBACKEND", "Agg")

SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"


@pytest.fixture
def compose_cfg():
    """Compose conf/ through Hydra's compose API, returning a plain dict as run.py sees it."""
    from experiments.config import compose

    def _compose(overrides=(), results_dir=None):
        d = compose(overrides)
        if results_dir is not None:
            d["results_dir"] = str(results_dir)
        return d
    return _compose


TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "data.vocab_size=8",
        "data.seq_len=16", "train.steps=6", "train.batch_size=4", "train.log_every=2",
        "train.diag_every=3", "train.eval_batches=1", "logger=none", "train.progress=false"]


@pytest.fixture
def tiny():
    return list(TINY)
