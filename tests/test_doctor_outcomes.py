"""The doctor's outcomes on the command line and in Python: a check that raises is inconclusive
(exit 3, assert_healthy raises, strict re-raises), an attention it cannot see into is not
healthy, a half that cannot run is not a pass, a missing transformers is exit 2 and one line,
`self:` from the console script in the clone, a factory returning an Adapter, `--help`, and the
numbers docs/doctor.md gives for the scale-after order."""
import math
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from attention_doctor import TorchMHA, examine
from attention_doctor.cli import main
from conftest import ROOT


def padding(ctx):   # stands in for the padding check: the doctor's own code raising
    raise ZeroDivisionError("a doctor bug")


@pytest.fixture
def padding_raises(monkeypatch):
    from attention_doctor.checks import batching
    monkeypatch.setattr(batching, "padding", padding)   # the record finds its function by name, when it runs


def mha_adapter():
    """A zero-argument factory returning an Adapter (the command line takes one)."""
    torch.manual_seed(0)
    a = TorchMHA(nn.MultiheadAttention(16, 2, batch_first=True), causal=True)
    a.need_weights = False   # need_weights=True returns NaN for a fully masked row (pytorch #41508)
    return a


def test_a_check_that_raises_is_inconclusive_never_a_pass(padding_raises, tmp_path, capsys):
    r = examine(mha_adapter(), checks=["eval_dropout", "padding"])
    row = r["padding"]
    assert row.verdict.startswith("inconclusive: doctor error (ZeroDivisionError: a doctor bug)")
    assert row.cause == "doctor_error" and row.inconclusive and not row.failed
    assert r.exit_code == 3 and not r.ok
    with pytest.raises(AssertionError, match="could not perform"):
        r.assert_healthy()
    r.assert_healthy(allow_inconclusive=["padding"])
    r.assert_healthy(allow_inconclusive=True)
    with pytest.raises(ZeroDivisionError):
        examine(mha_adapter(), checks=["eval_dropout", "padding"], strict=True)
    f = tmp_path / "r.json"
    assert main(["test_doctor_outcomes:mha_adapter", "--checks", "eval_dropout,padding", "--json", str(f)]) == 3
    out = capsys.readouterr().out
    assert "1 inconclusive" in out and "padding (doctor_error)" in out
    import json
    assert json.loads(f.read_text())["exit_code"] == 3


def test_a_factory_returning_an_adapter_and_the_header(capsys):
    assert main(["test_doctor_outcomes:mha_adapter"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("attention doctor: test_doctor_outcomes:mha_adapter (attention: need_weights=False")
    assert "nothing failed" in out


class EinsumAttention(nn.Module):
    """Causal attention written in einsum with a hand-made softmax: no softmax or SDPA call, the
    weights @ v an einsum whose output puts the queries before the heads. `products=False`: both
    products as broadcast multiplications summed, no matmul or einsum at all."""
    def __init__(self, d, h, products=True):
        super().__init__()
        self.h, self.products, self.to_qkv, self.proj = h, products, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.to_qkv(x).view(B, T, 3, self.h, C // self.h).unbind(2)
        if self.products:
            s = torch.einsum("bqhd,bkhd->bhqk", q, k)
        else:
            s = (q.transpose(1, 2)[..., :, None, :] * k.transpose(1, 2)[..., None, :, :]).sum(-1)
        s = s / math.sqrt(C // self.h)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        w = (s - s.amax(-1, keepdim=True)).exp()
        w = w / w.sum(-1, keepdim=True)
        if self.products:
            y = torch.einsum("bhqk,bkhd->bqhd", w, v)
        else:
            y = (w[..., None] * v.transpose(1, 2)[..., None, :, :]).sum(-2).transpose(1, 2)
        return self.proj(y.reshape(B, T, C))


class EinsumLM(nn.Module):
    def __init__(self, vocab=32, d=16, h=2, layers=2, products=True):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.randn(64, d) * 0.02)
        self.attn = nn.ModuleList(EinsumAttention(d, h, products) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.emb(ids) + self.pos[: ids.shape[1]]
        for a in self.attn:
            x = x + a(x)
        return self.head(self.norm(x))


def einsum_lm():
    torch.manual_seed(0)
    return EinsumLM()


def summed_products_lm():
    torch.manual_seed(0)
    return EinsumLM(products=False)


def test_einsum_with_a_hand_made_softmax_is_seen_and_healthy(capsys):
    r = examine(einsum_lm())
    assert r.info["attention_calls"] == {"handmade": 2}, r.info
    assert r.exit_code == 0 and not any(c.inconclusive for c in r.checks), r.table()
    assert main(["test_doctor_outcomes:einsum_lm"]) == 0


def test_an_attention_the_doctor_cannot_see_into_is_not_healthy(capsys):
    # the doctor sees attention through softmax/SDPA/flex calls, the products on either side of a
    # hand-made normalisation and known q/k layouts; products made as broadcast multiplications
    # summed show none of them, so every check that needs the scores says `inconclusive` and the
    # command exits 3, never 0
    r = examine(summed_products_lm())
    assert r.info["attention_calls"] == {}
    blind = {c.name: c.cause for c in r.checks if c.inconclusive}
    assert blind and set(blind.values()) <= {"scores_unseen", "no_qk_layout"}, r.table()
    assert not r.failed and r.exit_code == 3
    assert all(c.outcome in ("pass", "n/a") for c in r.checks if c.name not in blind)   # the black-box ones ran
    assert main(["test_doctor_outcomes:summed_products_lm"]) == 3
    assert "calls seen: none" in capsys.readouterr().out


class BF16Refuser(nn.Module):
    """An LM with learned absolute positions that raises in bfloat16 (weights cast or autocast)."""
    def __init__(self, vocab=32, d=16):
        super().__init__()
        self.emb, self.pos, self.head = nn.Embedding(vocab, d), nn.Embedding(8192, d), nn.Linear(d, vocab)

    def forward(self, ids, position_ids=None):
        if self.emb.weight.dtype == torch.bfloat16 or torch.is_autocast_enabled("cpu"):
            raise RuntimeError("this model does not run in bfloat16")
        pos = torch.arange(ids.shape[1]) if position_ids is None else position_ids
        return self.head(self.emb(ids) + self.pos(pos))


def test_long_positions_whose_bfloat16_half_raises_is_not_a_pass():
    # raising in bfloat16 on positions its float64 reference ran is the target's failure, as
    # low_precision reads it (raised_in_low_precision), never a pass nor a part the doctor could not run
    torch.manual_seed(0)
    r = examine(BF16Refuser(), checks=["eval_dropout", "long_positions"], strict=True)
    row = r["long_positions"]
    assert row.outcome == "fail" and row.cause == "raised_in_low_precision", row.verdict
    assert "absolute positions" in row.detail and r.exit_code == 1 and row.measurements["absolute_positions"]
    assert [(b["mode"], b["raised"]) for b in row.measurements["bfloat16"]] == [
        ("weights", "RuntimeError: this model does not run in bfloat16"),
        ("autocast", "RuntimeError: this model does not run in bfloat16")]


BLOCK_TRANSFORMERS = """
import sys
class Blocker:   # transformers not installed, as a user without the extra has it
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "transformers":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Blocker())
from attention_doctor.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("target", ["hf:gpt2", "my_model:build"])
def test_missing_transformers_is_exit_2_and_one_line_naming_the_fix(target, tmp_path):
    (tmp_path / "my_model.py").write_text("import transformers\n\ndef build():\n    pass\n")  # a user's module
    p = subprocess.run([sys.executable, "-c", BLOCK_TRANSFORMERS, target], cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "", p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "pip install -r requirements-validation.txt" in err[0], err


def test_hf_names_suggest_close_ones(capsys):
    pytest.importorskip("transformers")
    assert main(["hf:gtp2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did you mean gpt2" in err[0], err
    assert main(["hf:t5"]) == 2    # a model type, but not a causal LM
    assert "not a causal LM model type" in capsys.readouterr().err


def test_help_says_the_exit_codes_and_how_to_get_transformers(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for said in ("exit codes", "3  nothing failed, but a check was inconclusive", "1  a check failed",
                 "pip install -r requirements-validation.txt", "inconclusive: why"):
        assert said in out, said


CONSOLE = """
import importlib.util, sys
sys.path.insert(0, sys.argv[1])   # the installed packages, as the console script's environment has them
assert importlib.util.find_spec("experiments") is None, "the clone is on sys.path"
from attention_doctor.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("where", ["root", "docs", "outside"])
def test_self_from_the_console_script_in_the_clone(where, tmp_path):
    """`attention-doctor self:` as the console script runs it: attention and attention_doctor
    installed, the clone not on sys.path (python -P: no working directory either)."""
    site = tmp_path / "site"
    for pkg in ("attention", "attention_doctor"):
        shutil.copytree(ROOT / pkg, site / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    cwd = {"root": ROOT, "docs": ROOT / "docs", "outside": tmp_path}[where]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([sys.executable, "-P", "-c", CONSOLE, str(site), "self:", "--checks", "eval_dropout,kv_cache"],
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if where == "outside":
        assert p.returncode == 2 and p.stderr.strip().startswith("attention-doctor: self: needs a clone"), p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
    else:
        assert p.returncode == 0, p.stderr[-2000:]
        assert re.search(r"^kv_cache +pass ", p.stdout, re.M), p.stdout


def test_the_docs_numbers_for_the_scale_after_order_are_measured():
    """docs/doctor.md's "Why q k^T before the scale overflows" quotes the doctor's own run: measured
    again here (within the bisection's 6% step)."""
    from attention_doctor.project import build_self
    text = (ROOT / "docs" / "doctor.md").read_text()
    said = re.search(r"float16 stays\s+finite up to scores ~(\S+), the textbook reference .*? up to ~(\S+?)\.\s", text, re.S)
    assert said, "docs/doctor.md no longer quotes the two numbers"
    r = examine(build_self(["+exp=qk_fp16_overflow"]), checks=["eval_dropout", "low_precision"], strict=True)
    row = r["low_precision"]
    got = re.search(r"finite up to scores ~(\S+), the textbook reference .*? up to ~([^);]+)", row.detail)
    assert row.cause == "qk_before_scale" and got, row.detail
    for doc, now in zip(said.groups(), got.groups()):
        assert abs(float(doc) / float(now) - 1) < 0.06, (doc, now)
    # what the arithmetic says: d_k = 64, q.k = 8 s passes 65504 at s = 8188; scale first: 65504
    assert 0.9 < float(got[1]) / 8188 < 1.03 and 0.9 < float(got[2]) / 65504 < 1.03


def test_the_cause_of_a_low_precision_run_from_its_calls():
    """_cause reads the first non-finite attention call against the same call in float32: a
    padded query's row all -inf in float16 where float32 keeps finfo.min + score finite is a mask
    fill that overflowed; inf scores whose q.k passes 65504 before a scale that would bring them
    back is q k^T before the scale; finite scores with non-finite weights, the softmax."""
    from attention_doctor.checks.precision import _cause
    from attention_doctor.probes import Call
    f16, f32 = torch.float16, torch.float32
    vis = torch.tensor([[False, False], [True, False]])   # row 0: a padded query, every key masked
    s32 = torch.tensor([[3.0, -1.0], [2.0, -1.0]]).masked_fill(~vis, 0) - 100.0 + torch.finfo(f32).min * (~vis)
    s16 = s32.to(f16)                                      # finfo16.min - 100 rounds to -inf
    assert (s16[0] == float("-inf")).all() and torch.isfinite(s32).all()
    mk = lambda s: Call("softmax", "attn", scores=s[None, None], weights=torch.softmax(s.float(), -1).to(s.dtype)[None, None])
    cause, why = _cause([mk(s16)], [mk(s32)], f16)
    assert cause == "mask_fill_overflow" and "1 row(s) all -inf in float16" in why, why
    q = torch.full((1, 1, 2, 4), 200.0, dtype=f16)        # q.k = 160000 > 65504; times 0.125: 20000
    s = (q @ q.transpose(-2, -1)) * 0.125
    c = Call("softmax", "attn", q=q, k=q, scores=s, weights=torch.softmax(s.float(), -1).to(f16), scale=0.125)
    assert _cause([c], None, f16)[0] == "qk_before_scale"
    s = torch.tensor([[12.0, 1.0], [3.0, 2.0]], dtype=f16)
    w = s.exp() / s.exp().sum(-1, keepdim=True)            # a softmax without the max subtracted: exp(12) > 65504
    assert _cause([Call("softmax", "attn", scores=s[None, None], weights=w[None, None])], None, f16)[0] == \
        "softmax_low_precision"


class _MaskLM(nn.Module):
    """A small causal LM whose forward takes attention_mask (0/1, (B, T)); `ignore`: it takes the
    mask and never applies it; `nan`: its outputs are NaN everywhere; `forward_only`: it refuses
    autograd as FlexAttention does on CPU ("does not support backward on CPU"); `promote`: with a
    mask, its padded outputs are zeroed by a float32 mask, so a half model's stream turns float32 and
    its next Linear raises (x-transformers' masked output with einx >= 0.4); `rejects`: it raises on
    any mask."""
    def __init__(self, ignore=False, nan=False, forward_only=False, promote=False, rejects=False):
        super().__init__()
        self.emb, self.qkv, self.head = nn.Embedding(32, 16), nn.Linear(16, 48), nn.Linear(16, 32)
        self.ignore, self.nan, self.forward_only = ignore, nan, forward_only
        self.promote, self.rejects = promote, rejects

    def forward(self, idx, attention_mask=None):
        h = self.emb(idx)
        if self.forward_only and h.requires_grad:
            raise NotImplementedError("this attention does not support backward on CPU")
        B, T, C = h.shape
        q, k, v = self.qkv(h).view(B, T, 3, 2, C // 2).permute(2, 0, 3, 1, 4)
        keep = torch.ones(T, T, dtype=torch.bool).tril()
        if attention_mask is not None and not self.ignore:   # padding keys hidden; each query keeps its own: no empty row
            keep = keep & attention_mask.bool()[:, None, None, :] | torch.eye(T, dtype=torch.bool)
        if attention_mask is not None and self.rejects:
            raise ValueError("this target takes no mask of that kind")
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep).transpose(1, 2).reshape(B, T, C)
        if attention_mask is not None and self.promote:
            y = y * attention_mask[..., None].float()
        out = self.head(h + y)
        return out * float("nan") if self.nan else out


def test_an_ignored_mask_fails_padding_and_nan_is_never_agreement():
    """issue 44: a forward that takes attention_mask and ignores it fails padding (cause mask_ignored;
    fully_masked_rows cannot look: inconclusive), never n/a; the same forward honouring it passes; a
    forward that is NaN everywhere fails finite_output, and no comparison against it passes."""
    torch.manual_seed(0)
    checks = ["finite_output", "eval_dropout", "padding", "fully_masked_rows", "batch_independence", "future_leak"]
    good = examine(_MaskLM(), checks=checks, strict=True)
    assert good["finite_output"].verdict == "pass" and good["padding"].verdict == "pass", good["padding"].detail
    bad = examine(_MaskLM(ignore=True), checks=checks, strict=True)
    assert bad["padding"].outcome == "fail" and bad["padding"].cause == "mask_ignored", bad["padding"].detail
    assert bad["fully_masked_rows"].outcome == "inconclusive" and bad["fully_masked_rows"].cause == "mask_ignored"
    nan = examine(_MaskLM(nan=True), checks=checks)
    assert nan["finite_output"].outcome == "fail" and nan["finite_output"].cause == "nonfinite_output"
    assert nan["finite_output"].measurements["nonfinite"] == nan["finite_output"].measurements["values"] > 0
    assert not any(r.outcome == "pass" for r in nan.checks if r.name in ("padding", "batch_independence", "future_leak"))
    assert nan.exit_code == 1


def test_a_forward_only_target_runs_every_check_it_can_and_names_the_gradient_halves():
    """issue 44: a forward that refuses autograd (FlexAttention on CPU) is run forward-only: nothing
    fails for it (never target_raised), the gradient halves are inconclusive naming the refusal."""
    torch.manual_seed(0)
    r = examine(_MaskLM(forward_only=True), checks=["finite_output", "eval_dropout", "future_leak", "padding",
                                                     "fully_masked_rows"])
    assert not r.failed, r.table()
    assert r["finite_output"].outcome == r["padding"].outcome == "pass"
    for name in ("future_leak", "fully_masked_rows"):
        assert r[name].outcome == "inconclusive" and r[name].cause == "part_not_run", r[name].detail
        assert "refuses autograd" in r[name].reason and "gradient" in r[name].reason, r[name].reason
    assert r.exit_code == 3


def test_a_target_that_raises_left_padded_in_low_precision_only_fails_low_precision():
    """A left-padded batch the target runs in its own precision and raises on in float16 or
    bfloat16 weights is the target's failure (raised_in_low_precision, the batch in its
    measurements), never a part not run; a mask it rejects in any precision is not its failure."""
    torch.manual_seed(0)
    checks = ["eval_dropout", "low_precision"]
    row = examine(_MaskLM(promote=True), checks=checks, strict=True)["low_precision"]
    assert row.outcome == "fail" and row.cause == "raised_in_low_precision", row.detail
    raised = [r for r in row.measurements["nonfinite_runs"] if "raised" in r]
    assert raised and {r["batch"] for r in raised} == {"left_padded"}
    assert {r["dtype"] for r in raised} == {"float16", "bfloat16"} and {r["mode"] for r in raised} == {"weights"}
    assert "same dtype" in raised[0]["raised"]
    assert examine(_MaskLM(), checks=checks, strict=True)["low_precision"].outcome == "pass"
    row = examine(_MaskLM(rejects=True), checks=checks, strict=True)["low_precision"]
    assert row.outcome != "fail" and row.cause != "raised_in_low_precision", row.detail
