"""Outcomes decided by structure (attention_doctor/signals.py): the signals cannot be swallowed by
an `except Exception`; only the target's own forward fails a check, a fault in an adapter's own
code (transformers, x-transformers, diffusers, the conventions adapter) is `inconclusive: doctor
error` (exit 3), a user Adapter's is `adapter_error`, the doctor's instrumentation inside the
forward is never the target's; a refused backward leaves the check inconclusive naming the
gradient half; no NaN reads as agreement; and the one parser reads the result schema, new and old."""
import json
import math

import pytest
import torch
import torch.nn as nn

from attention_doctor import Adapter, DoctorResult, Outcome, Row, Unreachable, Unsupported, examine
from attention_doctor.checks.common import rel
from attention_doctor.signals import (
    AdapterError,
    DoctorBug,
    NotPerformed,
    Signal,
    TargetError,
    TargetRaised,
    doctor_hook,
)
from doctor_lab.styles import classic as S
from test_doctor_layouts import _NoBackwardInEval  # a backward that refuses eval mode (Reformer's)


def test_signals_are_not_exceptions_so_no_except_exception_swallows_them():
    for cls in (Unsupported, Unreachable, NotPerformed, TargetRaised, DoctorBug, AdapterError):
        assert issubclass(cls, Signal) and issubclass(cls, BaseException) and not issubclass(cls, Exception), cls
    assert issubclass(TargetError, Exception) and not issubclass(TargetError, Signal)   # exit 2: an error

    class Swallows(Adapter):   # a user's adapter with a broad except around its code
        kind, causal = "layer", True

        def __init__(self):
            super().__init__(nn.Linear(8, 8))
            self.d_model = 8

        def forward(self, x, mask=None, positions=None):
            try:
                if mask is not None:
                    raise Unsupported("needs a padding mask (this layer takes none)", "no_padding_mask")
                return self.module(x)
            except Exception:  # noqa: BLE001 -- the user's broad except this test is about: it must not see a signal
                return self.module(x)   # would hide the signal if it were an Exception
    r = examine(Swallows(), checks=["eval_dropout", "padding"], strict=True)
    assert r["padding"].outcome is Outcome.NA and r["padding"].cause == "no_padding_mask"


# -- a fault planted in a built-in adapter's own code: inconclusive, doctor_error, exit 3 --------------

def boom(*a, **k):
    raise ZeroDivisionError("planted in the adapter's own code")


def _doctor_error(r, checks):
    for c in checks:
        row = r[c]
        assert row.outcome is Outcome.INCONCLUSIVE and row.cause == "doctor_error", (c, row.verdict, row.detail)
        assert "ZeroDivisionError: planted" in row.reason and row.measurements["error"].startswith("ZeroDivisionError")
    assert r.exit_code == 3 and not r.failed


def test_transformers_adapter_fault_is_a_doctor_error(monkeypatch):
    pytest.importorskip("transformers")
    from attention_doctor import hf
    model = hf.build("llama", "sdpa")
    monkeypatch.setattr(hf, "_params", boom)   # read by prefill and by positions, outside the model's forward
    _doctor_error(examine(model, checks=["eval_dropout", "kv_cache", "long_positions"]), ["kv_cache", "long_positions"])
    with pytest.raises(ZeroDivisionError):
        examine(model, checks=["eval_dropout", "kv_cache"], strict=True)


def test_x_transformers_adapter_fault_is_a_doctor_error(monkeypatch):
    pytest.importorskip("x_transformers")
    from attention_doctor import xtransformers
    a = xtransformers.target("rotary_pos_emb=True")
    monkeypatch.setattr(xtransformers, "_attends", boom)   # use_path's switch of the flash flags
    _doctor_error(examine(a, checks=["eval_dropout", "path_agreement"]), ["path_agreement"])


def test_diffusers_adapter_fault_is_a_doctor_error(monkeypatch):
    pytest.importorskip("diffusers")
    from attention_doctor import diffusers
    a = diffusers.target("AttnProcessor2_0")
    monkeypatch.setattr(type(a), "_mask_form", boom)   # the mask as diffusers' models pass it
    _doctor_error(examine(a, checks=["eval_dropout", "padding", "fully_masked_rows"]), ["padding", "fully_masked_rows"])


def nanogpt():
    """A zero-argument factory for the command line: the nanoGPT style, healthy."""
    return S.build("nanogpt")


def test_conventions_adapter_fault_is_a_doctor_error_for_every_check(monkeypatch, capsys):
    from attention_doctor import conventions
    from attention_doctor.cli import main
    monkeypatch.setattr(conventions, "_change", boom)   # measuring the mask encoding, while preparing
    r = examine(nanogpt(), checks=["eval_dropout", "padding", "score_scale"])
    _doctor_error(r, ["eval_dropout", "padding", "score_scale"])
    assert r["padding"].reason.endswith("while preparing the target")
    assert main(["test_doctor_signals:nanogpt", "--checks", "eval_dropout,padding"]) == 3   # the command: exit 3
    assert "2 inconclusive" in capsys.readouterr().out


def test_conventions_forward_fault_after_preparing(monkeypatch):
    """The adapter's code around the target's forward (here: encoding the padding mask) raising on
    the checks' batches only, after preparing: the check that gave the mask is a doctor error."""
    from attention_doctor import conventions
    real = conventions.ENCODINGS["0/1 integers"]
    lm = S.build("nanogpt")
    r0 = examine(lm, checks=["eval_dropout", "padding"], strict=True)
    assert r0["padding"].outcome is Outcome.PASS
    monkeypatch.setitem(conventions.ENCODINGS, "0/1 integers", lambda m, dt: boom() if m.shape[0] > 1 else real(m, dt))
    _doctor_error(examine(lm, checks=["eval_dropout", "padding"]), ["padding"])


# -- a user's Adapter: its own code is adapter_error; the target's forward still fails -----------------

class CachedLM(Adapter):
    """A user's adapter over the functional style's cache (start_pos)."""
    kind, causal = "lm", True

    def __init__(self, lm, fault=None):
        super().__init__(lm, "a user's adapter")
        self.vocab_size, self.fault = S.VOCAB, fault

    def forward(self, x, mask=None, positions=None):
        if mask is not None or positions is not None:
            raise Unsupported("needs neither here", "unsupported")
        return self.module(x)

    def prefill(self, x):
        if self.fault == "adapter":
            {}["the adapter's own bug"]
        return x.shape[1], self.module(x, start_pos=0)

    def step(self, n, x):
        if self.fault == "target":
            return n, self.module(x, start_pos=S.MAX_POS)   # the model's own code raises: no slot there
        return n + x.shape[1], self.module(x, start_pos=n)


def test_a_user_adapter_fault_is_an_adapter_error_and_the_target_still_fails():
    r = examine(CachedLM(S.build("functional"), "adapter"), checks=["eval_dropout", "kv_cache"])
    row = r["kv_cache"]
    assert row.outcome is Outcome.INCONCLUSIVE and row.cause == "adapter_error" and "KeyError" in row.reason, row
    assert r.exit_code == 3
    with pytest.raises(KeyError):
        examine(CachedLM(S.build("functional"), "adapter"), checks=["eval_dropout", "kv_cache"], strict=True)
    r = examine(CachedLM(S.build("functional"), "target"), checks=["eval_dropout", "kv_cache"], strict=True)
    row = r["kv_cache"]
    assert row.outcome is Outcome.FAIL and row.cause == "target_raised", row
    # one new token past the cache broadcasts into its empty slice; three raise (in the model's own code)
    assert row.measurements["raised_in"] == {"prefill_tokens": 13, "new_tokens": 3, "call": "step"}
    assert [t["new_tokens"] for t in row.measurements["trials"]] == [1]
    assert examine(CachedLM(S.build("functional")), checks=["eval_dropout", "kv_cache"], strict=True).ok


# -- the doctor's instrumentation inside the target's forward is never the target's -------------------

def test_a_probe_error_inside_the_forward_is_a_doctor_error_not_the_targets(monkeypatch):
    from attention_doctor import probes
    monkeypatch.setattr(probes.Probe, "_softmax", boom)
    r = examine(S.build("nanogpt"), checks=["eval_dropout", "self_visibility", "kv_cache"])
    assert r["self_visibility"].cause == "doctor_error" and r["self_visibility"].outcome is Outcome.INCONCLUSIVE
    assert r["eval_dropout"].outcome is Outcome.PASS   # the checks that do not probe are not touched


def test_a_hook_error_inside_the_forward_is_a_doctor_error(monkeypatch):
    from attention_doctor import layouts
    monkeypatch.setattr(layouts.FusedSite, "_split", boom)   # scaling q and k in a hook of nanoGPT's c_attn
    r = examine(S.build("nanogpt"), checks=["eval_dropout", "amplified_logits"])
    assert r["amplified_logits"].cause == "doctor_error", r["amplified_logits"].verdict
    wrapped = doctor_hook(boom)
    with pytest.raises(DoctorBug) as e:
        wrapped()
    assert isinstance(e.value.__cause__, ZeroDivisionError)


# -- a part that could not run: never a pass ----------------------------------------------------------

class RefusingLayer(Adapter):
    """nn.MultiheadAttention, causal, taking a padding mask, whose backward refuses eval mode."""
    kind, causal = "layer", True

    def __init__(self):
        torch.manual_seed(0)
        super().__init__(nn.MultiheadAttention(16, 2, batch_first=True), "refusing")
        self.d_model = 16

    def forward(self, x, mask=None, positions=None):
        if positions is not None:
            raise Unsupported("needs positions (a layer takes none)", "no_positions")
        T = x.shape[1]
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        y, _ = self.module(x, x, x, attn_mask=future, key_padding_mask=None if mask is None else ~mask,
                           need_weights=False)
        return _NoBackwardInEval.apply(y)


def test_a_refused_backward_leaves_the_gradient_half_named_and_inconclusive():
    r = examine(RefusingLayer(), checks=["eval_dropout", "future_leak", "fully_masked_rows"], strict=True)
    for c in ("future_leak", "fully_masked_rows"):
        row = r[c]
        assert row.outcome is Outcome.INCONCLUSIVE and row.cause == "part_not_run", (c, row.verdict)
        assert row.reason.startswith("the gradient half could not run (its backward raised in eval mode"), row.reason
        assert row.measurements["not_run"] == ["the gradient half"]
    assert r["fully_masked_rows"].measurements["nonfinite_outputs"] == 0   # the half that ran, kept
    assert r["fully_masked_rows"].measurements["nonfinite_gradients"] is None and r.exit_code == 3


# -- no NaN reads as agreement ------------------------------------------------------------------------

def test_rel_never_reads_nan_as_agreement():
    ref = torch.tensor([1.0, 2.0, 3.0])
    assert rel(ref.clone(), ref) == 0.0
    assert rel(torch.tensor([1.0, float("nan"), 3.0]), ref) == math.inf   # a side not finite where ref is: fails
    with pytest.raises(NotPerformed) as e:   # the reference not finite itself: nothing to compare
        rel(ref, torch.tensor([1.0, float("nan"), 3.0]))
    assert e.value.cause == "reference_nonfinite"


def test_cached_scores_that_are_not_finite_are_never_agreement():
    from attention_doctor.checks.cached_positions import _per_query, _rel
    s = torch.randn(1, 1, 4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    vis = torch.ones(4, 4, dtype=torch.bool).tril().expand(1, 1, 4, 4)
    assert _rel([(s, vis)], [(s, vis)]) == 0.0
    bad = s.clone()
    bad[0, 0, 3, 1] = float("nan")   # a score row that overflowed
    assert _rel([(bad, vis)], [(s, vis)]) == math.inf and _per_query([(bad, vis)], [(s, vis)]) == math.inf
    with pytest.raises(NotPerformed):
        _rel([(s, vis)], [(bad, vis)])


class NaNLayer(nn.Module):
    """A causal layer whose first position's output is NaN: nothing compared against it holds."""
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x).cumsum(1)
        return torch.cat([torch.full_like(y[:, :1], float("nan")), y[:, 1:]], 1)


def test_a_target_whose_reference_output_is_nan_is_inconclusive_never_a_pass():
    r = examine(NaNLayer(), causal=True, checks=["eval_dropout", "future_leak", "batch_independence"], strict=True)
    assert r["eval_dropout"].outcome is Outcome.PASS   # the same NaN twice is repeatable
    for c in ("future_leak", "batch_independence"):
        assert r[c].outcome is Outcome.INCONCLUSIVE and r[c].cause == "reference_nonfinite", r[c].verdict


# -- a crash is not "by nature" -----------------------------------------------------------------------

class MaskCrashes(nn.Module):
    """An LM that takes `mask` and raises on any (a mask of a shape no encoding gives)."""
    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(16, 8), nn.Linear(8, 16)

    def forward(self, ids, mask=None):
        if mask is not None:
            raise RuntimeError("mask must be (B, T, T)")
        return self.head(self.emb(ids).cumsum(1))


def test_a_forward_that_raises_under_every_mask_encoding_is_not_na():
    r = examine(MaskCrashes(), checks=["eval_dropout", "padding", "fully_masked_rows"], strict=True)
    assert r.info["conventions"]["mask"].startswith("mask: its forward raised under every encoding tried")
    for c in ("padding", "fully_masked_rows"):
        assert r[c].outcome is Outcome.INCONCLUSIVE and r[c].cause == "unreachable", r[c].verdict


class FlashLM(nn.Module):
    """A `flash` switch whose other setting raises for another reason than a part it lacks."""
    def __init__(self):
        super().__init__()
        self.emb, self.head, self.flash = nn.Embedding(16, 8), nn.Linear(8, 16), True

    def forward(self, ids):
        if not self.flash:
            raise RuntimeError("the manual path needs CUDA")
        return self.head(self.emb(ids).cumsum(1))


def test_a_path_that_raises_is_not_dropped():
    r = examine(FlashLM(), checks=["eval_dropout", "path_agreement"], strict=True)
    row = r["path_agreement"]
    assert row.outcome is Outcome.INCONCLUSIVE and row.cause == "unreachable", row.verdict
    assert "flash=False raises (RuntimeError: the manual path needs CUDA)" in r.info["conventions"]["paths"]


def test_diffusers_path_that_raises_is_not_dropped_and_another_call_is_no_path():
    pytest.importorskip("diffusers")
    from attention_doctor import diffusers
    r = examine(diffusers.target("JointAttnProcessor2_0"), checks=["eval_dropout", "path_agreement"], strict=True)
    assert r["path_agreement"].cause == "unreachable" and "FusedJointAttnProcessor2_0" in r["path_agreement"].reason
    # the image-prompt processors read tokens the plain ones do not: not the same call, no path
    a = diffusers.target("IPAdapterAttnProcessor2_0,cross")
    assert a.paths() == ["IPAdapterAttnProcessor2_0"]


# -- one schema, one parser ---------------------------------------------------------------------------

def test_rows_round_trip_and_the_older_format_is_read():
    row = Row("padding", "warn", "", "positions_from_padding", 0.31, "<= 1e-05",
              {"limit": 1e-5, "right": 0.0, "left": 0.31, "left_with_positions": float("nan"), "runs": [{"x": float("inf")}]},
              detail="words")
    d = json.loads(json.dumps(row.to_dict()))
    assert d["outcome"] == "warn" and d["verdict"] == "warn" and d["measurements"]["left_with_positions"] == "nan"
    back = Row.from_dict(d)
    assert back.outcome is Outcome.WARN and back.cause == row.cause and back.measurements["runs"][0]["x"] == math.inf
    assert math.isnan(back.measurements["left_with_positions"])
    old = {"target": "t", "exit_code": 3, "checks": [
        {"name": "kv_cache", "verdict": "n/a: needs a KV cache", "measured": None, "tolerance": "", "experiment": "",
         "thread": "", "detail": "", "cause": ""},
        {"name": "padding", "verdict": "inconclusive: eval outputs are not repeatable", "measured": "inf",
         "cause": "not_repeatable"},
        {"name": "future_leak", "verdict": "skip: doctor error (x)"}]}
    r = DoctorResult.from_dict(old)
    assert r["kv_cache"].outcome is Outcome.NA and r["kv_cache"].reason == "needs a KV cache"
    assert r["padding"].inconclusive and r["padding"].measured == math.inf and r.exit_code == 3
    assert r["future_leak"].inconclusive   # an older doctor's skip is never a pass
    assert DoctorResult.from_json(json.dumps(old)).verdicts() == r.verdicts()
    assert Outcome.PASS == "pass" and f"{Outcome.NA}" == "n/a" and str(Outcome.FAIL) == "fail"


def test_the_docs_json_row_is_a_real_run():
    """docs/doctor.md's example row (its detail cut short) is what the command it names writes."""
    import re

    from attention_doctor.project import build_self
    from conftest import ROOT
    text = (ROOT / "docs" / "doctor.md").read_text()
    said = json.loads(re.search(r"<!-- row -->\s*```json\n(.*?)```", text, re.S)[1])
    r = examine(build_self(["+exp=left_padding_positions"]), checks=["eval_dropout", "padding"], strict=True)
    got = r["padding"].to_dict()
    # numbers as measured here, within rounding (a difference below the tolerance is rounding noise)
    near = lambda a, b: math.isclose(a, b, rel_tol=1e-3) or max(abs(a), abs(b)) <= 1e-5
    assert near(got.pop("measured"), said.pop("measured"))
    gm, sm = got.pop("measurements"), said.pop("measurements")
    assert gm.keys() == sm.keys() and all(near(gm[k], sm[k]) for k in gm), (gm, sm)
    assert got.pop("detail").split(":")[0] == said.pop("detail").split(":")[0] and got == said   # detail: prose
