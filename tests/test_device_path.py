"""The GPU path's switches, checked on the CPU: device=auto picks CUDA with bf16 autocast and
fused AdamW, and the compiled and bf16 loops train as the eager float32 one does."""
import pytest
import torch

from experiments.training.build import autocast_dtype, build_optimizer, pick_device
from experiments.training.loop import Trainer
from tests.conftest import TINY


def test_auto_picks_cuda_with_bf16_when_cuda_is_there(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    dev = pick_device("auto")
    assert dev.type == "cuda" and autocast_dtype("auto", dev) is torch.bfloat16
    assert autocast_dtype("auto", torch.device("cpu")) is None  # CPU stays float32 unless asked
    assert autocast_dtype("float16", torch.device("cpu")) is torch.float16


def test_adamw_is_fused_on_cuda_and_cpu_and_steps_as_the_unfused_one():
    model = torch.nn.Linear(4, 4)
    cfg = {"name": "adamw", "lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
    assert build_optimizer(cfg, model, torch.device("cuda")).defaults["fused"] is True
    assert not build_optimizer(cfg, model, torch.device("mps")).defaults["fused"]
    fused = build_optimizer(cfg, model, torch.device("cpu"))
    assert fused.defaults["fused"] is True
    twin = torch.nn.Linear(4, 4)
    twin.load_state_dict(model.state_dict())
    plain = torch.optim.AdamW([{"params": [twin.weight], "weight_decay": 0.1}, {"params": [twin.bias], "weight_decay": 0.0}],
                              lr=1e-3, betas=(0.9, 0.95), eps=1e-8, foreach=False)   # build_optimizer's groups
    for _ in range(3):
        for m, opt in ((model, fused), (twin, plain)):
            opt.zero_grad()
            m(torch.ones(2, 4)).square().sum().backward()
            opt.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)


def test_a_missing_config_key_is_an_error_naming_it_not_a_default():
    """conf/ is where a default lives: code that finds no betas says so instead of using its own."""
    model = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match=r"^optim\.betas is missing from the config$"):
        build_optimizer({"name": "adamw", "lr": 1e-3, "eps": 1e-8, "weight_decay": 0.0}, model, torch.device("cpu"))


def _losses(compose_cfg, tmp_path, *extra):
    cfg = compose_cfg(TINY + ["train.log_every=1", "device=cpu", *extra], results_dir=tmp_path)
    tr = Trainer(cfg, tmp_path)
    res = tr.run()
    assert res.status == "completed"
    return tr, torch.tensor([float(r["loss/train"]) for r in res.rows])


def test_bf16_autocast_runs_in_bf16_and_trains_like_float32(compose_cfg, tmp_path):
    tr, bf16 = _losses(compose_cfg, tmp_path / "bf16", "train.dtype=bfloat16")
    with torch.no_grad(), tr.amp():
        assert tr.model(tr.task.batch(0, 2).x).dtype is torch.bfloat16
    _, fp32 = _losses(compose_cfg, tmp_path / "fp32", "train.dtype=float32")
    assert not torch.equal(bf16, fp32)                     # autocast changed the arithmetic
    assert torch.allclose(bf16, fp32, rtol=0.02)           # but not the training


def test_compiled_loop_matches_eager(compose_cfg, tmp_path):
    """train.compile=true: compiled steps, eager diagnostic steps (0, 3, end), same losses."""
    from torch._dynamo.utils import counters
    counters.clear()
    tr, compiled = _losses(compose_cfg, tmp_path / "compiled", "train.compile=true")
    assert isinstance(tr.forward, torch._dynamo.eval_frame.OptimizedModule)
    assert counters["stats"]["unique_graphs"] >= 1         # dynamo traced the non-diagnostic steps
    _, eager = _losses(compose_cfg, tmp_path / "eager")
    assert len(compiled) == len(eager) == 6
    assert torch.allclose(compiled, eager, atol=1e-4)
