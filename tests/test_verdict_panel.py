"""The verdict panel of an experiment's figure (report.verdict_panel): every check's value on the
failure and its control per seed, against its threshold, from the runs' verdicts."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from experiments.report import verdict_panel as vp  # noqa: E402
from experiments.report.figures import plot_experiment  # noqa: E402


def verdict(diff, status="completed", reproduced=True):
    """A causal_kv_cache-like verdict: cached logits differ by `diff` (control 1e-7), a status
    check, and a check not measurable on this data."""
    return {"reproduced": reproduced, "signature_broken": False, "control_status": "completed", "checks": [
        {"name": "no error", "kind": "status", "passed": status == "completed", "measured": status,
         "expected": "== completed", "control": "completed", "control_passed": True},
        {"name": "cached logits differ", "kind": "threshold", "passed": diff >= 1, "measured": diff,
         "expected": ">= 1", "control": 1e-7, "control_passed": False},
        {"name": "late copy worse", "kind": "delta", "passed": False, "measured": float("inf"),
         "expected": ">= 0.51986", "control": 0.0, "control_passed": False},
        {"name": "loss/copy solved", "kind": "threshold", "passed": False, "measured": None,
         "expected": "not measurable on this data", "not_measurable": True, "report_only": True}]}


def test_threshold_is_read_from_the_verdicts_text():
    assert vp.threshold({"kind": "threshold", "expected": ">= 1.03972"}) == (">=", 1.03972)
    assert vp.threshold({"kind": "near", "expected": "rel. error to attn/x <= 0.15"}) == ("<=", 0.15)
    assert vp.threshold({"kind": "status", "expected": "== diverged"}) == ("==", "diverged")
    assert vp.threshold({"kind": "threshold", "expected": "reported"}) is None


def test_panel_shows_each_check_per_seed_against_its_threshold():
    verdicts = [(2, verdict(8.4)), (0, verdict(12.0)), (1, verdict(0.5, reproduced=False))]
    [d, *_] = vp.checks_by_name(sorted(verdicts))
    assert d["seeds"] == [0, 1, 2] and d["failure"] == [("completed", True)] * 3 and len(d["control"]) == 3

    fig = plt.figure(figsize=(6, 8), layout="constrained")
    vp.draw(fig, fig.add_gridspec(1, 1)[0], verdicts)
    head, *strips = fig.axes
    texts = " ".join(t.get_text() for t in head.texts)
    assert "reproduced in 2 of 3" in texts and "signature on the control in 0 of 3" in texts
    assert "○ seed 0  □ seed 1  △ seed 2" in texts and "not measurable on this data: loss/copy solved" in texts
    assert len(strips) == 3  # the not measurable check has no strip
    status, diff, delta = strips
    assert [t.get_text() for t in status.get_xticklabels()] == list(vp.STATUSES)
    assert diff.get_title(loc="left").startswith("✗ cached logits differ: holds in 2 of 3; signature: >= 1")
    assert diff.get_xscale() == "log"  # 1e-7 .. 12 spans decades
    assert [ln.get_xdata()[0] for ln in diff.lines if ln.get_linestyle() == "--"] == [1]
    drawn = [ln for ln in diff.lines if ln.get_marker() not in ("None", "")]
    filled = sorted((ln.get_xdata()[0], ln.get_markerfacecolor() != "white") for ln in drawn if ln.get_alpha() != 0)
    assert filled == [(1e-7, False)] * 3 + [(0.5, False), (8.4, True), (12.0, True)]
    assert delta.get_xlabel() == "failure − control"
    assert [t.get_text() for t in delta.texts] == ["inf"]  # a non-finite value: at the edge, named once
    plt.close(fig)


def test_figure_carries_the_panel_beside_the_curves(tmp_path):
    df = pd.DataFrame({"step": [0, 10], "loss/copy": [4.0, 0.1]})
    path = plot_experiment(tmp_path / "f.png", "causal_kv_cache", [("causal_kv_cache", df, None)],
                           [("causal_lower_right", df, None)], verdicts=[(0, verdict(8.4))])
    assert path.stat().st_size > 10_000
