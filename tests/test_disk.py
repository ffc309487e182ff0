"""What a run leaves on disk is what it means to keep: the attention weights of example 0 (not
views of the whole batch), and a checkpoint whose size does not grow with the step."""
import numpy as np
import torch

from conftest import TINY
from experiments.io import load_attn_weights
from experiments.training import checkpoint
from experiments.training import loop as train
from experiments.training.runner import run_experiment


def test_attn_weights_file_is_its_contents(compose_cfg, tmp_path):
    # a batch of 16 with T = 31: a stored view of example 0 would drag all 16 examples along
    cfg = compose_cfg([*TINY, "train.batch_size=16", "data.seq_len=32", "train.steps=12",
                       "train.diag_every=2"], results_dir=tmp_path)
    run_experiment(cfg, tmp_path / "run")
    path = tmp_path / "run" / "attn_weights.npz"
    w = load_attn_weights(path)
    steps, layers = sorted(w), sorted(w[0])
    assert steps == [0, 2, 4, 6, 8, 10, 11] and layers == ["L0"]
    h, T = cfg["model"]["n_heads"], 31
    assert all(w[s]["L0"].shape == (h, T, T) and w[s]["L0"].dtype == np.float16 for s in steps)
    need = len(steps) * len(layers) * h * T * T * 2  # float16
    assert need <= path.stat().st_size <= 1.1 * need
    # they are the softmax rows of example 0: each sums to 1 up to float16 rounding
    np.testing.assert_allclose(w[11]["L0"].astype(np.float32).sum(-1), 1.0, atol=5e-3)


def test_recorder_keeps_a_copy_of_example_0_not_a_view():
    from attention.diagnostics import Recorder
    weights = torch.softmax(torch.randn(8, 2, 5, 5), -1)
    rec = Recorder(keep_weights=True)
    rec.record("L0", torch.randn(8, 2, 5, 4), torch.randn(8, 2, 5, 4), torch.randn(8, 2, 5, 5),
               weights, None)
    kept = rec.weights["L0"]
    assert kept.untyped_storage().nbytes() == 2 * 5 * 5 * 2  # its own float16 storage
    torch.testing.assert_close(kept.float(), weights[0], atol=1e-3, rtol=0)


def test_checkpoint_size_does_not_grow_with_the_step(compose_cfg, tmp_path, monkeypatch):
    cfg = compose_cfg([*TINY, "train.steps=60", "train.ckpt_every=5", "train.log_every=1",
                       "train.diag_every=1"], results_dir=tmp_path)
    sizes = {}
    orig = train.Trainer.save_checkpoint

    def save_and_measure(self):
        orig(self)
        sizes[self.step] = self.ckpt_path.stat().st_size
    monkeypatch.setattr(train.Trainer, "save_checkpoint", save_and_measure)
    ckpt = tmp_path / "ckpt" / "ckpt.pt"
    t = train.Trainer(cfg, tmp_path / "run", ckpt_path=ckpt)
    t.run()
    assert sorted(sizes) == list(range(5, 60, 5))
    assert abs(sizes[55] - sizes[5]) <= 0.02 * sizes[5], sizes
    # the growing part lives beside it, one chunk per checkpoint, each with only its own steps
    chunks = checkpoint.chunks(ckpt)
    assert [p.name for p in chunks] == [f"log-{s:08d}.pt" for s in range(5, 60, 5)]
    last = torch.load(chunks[-1], weights_only=False)
    assert [r["step"] for r in last["rows"]] == list(range(50, 55)) and sorted(last["attn_weights"]) == list(range(50, 55))
    # resuming from the last checkpoint rebuilds every row and weight recorded before it
    t2 = train.Trainer(cfg, tmp_path / "run2", ckpt_path=ckpt)
    assert t2.try_resume() and t2.step == 55
    assert t2.res.rows == [r for r in t.res.rows if r["step"] < 55]
    assert sorted(t2.res.attn_weights) == list(range(55))
    assert torch.equal(t2.res.attn_weights[54]["L0"], t.res.attn_weights[54]["L0"])
    checkpoint.remove_checkpoint(ckpt)
    assert not list(ckpt.parent.iterdir())
