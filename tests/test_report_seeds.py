"""Rates and margins over seeds (experiments.report.seeds), on hand-made summaries: no training."""
import math

import pytest

from experiments.records import RunRecord
from experiments.report import seeds
from experiments.report.sections.catalogue import flags, rate_lines, worst_margin


@pytest.mark.parametrize("k, n, lo, hi", [(3, 3, 0.439, 1.0), (0, 3, 0.0, 0.561), (2, 3, 0.208, 0.939),
                                          (1, 2, 0.095, 0.905)])
def test_wilson_interval_known_values(k, n, lo, hi):
    a, b = seeds.wilson(k, n)
    assert (round(a, 3), round(b, 3)) == (lo, hi)


def test_wilson_interval_narrows_with_n_and_covers_the_rate():
    assert seeds.wilson(30, 30)[0] > seeds.wilson(3, 3)[0]
    for k, n in ((1, 7), (5, 9), (12, 40)):
        lo, hi = seeds.wilson(k, n)
        assert 0 <= lo < k / n < hi <= 1
    assert seeds.wilson(0, 0) == (0.0, 1.0)


def test_threshold_is_read_from_the_verdicts_expected_text():
    assert seeds.threshold(">= 2.07944") == (">=", 2.07944)
    assert seeds.threshold("rel. error to dropout/p <= 0.1") == ("<=", 0.1)
    assert seeds.threshold("< 1e-06") == ("<", 1e-6)
    assert seeds.threshold("== diverged") is None and seeds.threshold("reported") is None


def check(name, measured, expected, passed, kind="threshold", report_only=False, control=None):
    c = {"name": name, "kind": kind, "measured": measured, "expected": expected, "passed": passed,
         "report_only": report_only}
    if control is not None:
        c["control"] = control
    return c


def three_seeds():
    """Three seeds of one failure: a >= check at 10, 12, 14 (threshold 8), a <= check at 0.1, 0.2, 0.3
    (threshold 1), a check all seeds agree on, a status check, a report-only measurement, and a
    near check, and the second seed's control shows the whole signature."""
    out = []
    for i, (big, small, status) in enumerate(((10, 0.1, "diverged"), (12, 0.2, "diverged"), (14, 0.3, "diverged"))):
        checks = [check("big", big, ">= 8", True, control=1.0),
                  check("small", small, "<= 1", True, control=2.0),
                  check("exact", 5.0, ">= 2", True),
                  check("status", status, "== diverged", True, kind="status"),
                  check("reported", 100.0 * i, "reported", True, report_only=True),
                  check("near", 0.01 * (i + 1), "rel. error to x <= 0.1", True, kind="near")]
        out.append(RunRecord.from_summary({
            "exp": "demo", "status": "completed", "role": "failure", "seed": i, "config_hash": f"h{i}",
            "config": {"train": {"steps": 5}, "seed": i},
            "verdict": {"reproduced": i != 1, "signature_broken": i == 1, "checks": checks}}))
    return out


def test_margin_is_the_worst_seeds_distance_in_stds_over_seeds():
    by_name = {c.name: c for c in seeds.checks_over_seeds(three_seeds())}
    # big: worst 10 - 8 = 2, std of (10, 12, 14) = 2 -> 1.0, under the rule's 2: flagged
    assert by_name["big"].margin == pytest.approx(1.0) and by_name["big"].small
    assert by_name["big"].flags() == ["margin < 2"] and by_name["big"].control == [1.0, 1.0, 1.0]
    # small (<=): worst 1 - 0.3 = 0.7, std 0.1 -> 7
    assert by_name["small"].margin == pytest.approx(7.0) and not by_name["small"].small
    assert by_name["near"].margin == pytest.approx(7.0)  # (0.1 - 0.03) / 0.01
    assert by_name["exact"].margin == math.inf and seeds.fmt_margin(math.inf) == "inf"
    assert by_name["status"].margin is None and by_name["reported"].margin is None
    assert not by_name["reported"].gate


def test_margin_edge_cases():
    assert seeds.margin([1.0, 1.0], ">=", 2.0, all_pass=False) == -math.inf   # all agree, all fail
    assert seeds.margin([3.0], ">=", 2.0, all_pass=True) is None             # one seed: no spread
    assert seeds.margin([3.0, None, 4.0], ">=", 2.0, all_pass=False) is None  # a seed measured nothing
    assert seeds.margin([3.0, math.inf], ">=", 2.0, all_pass=False) is None
    assert seeds.margin([1.0, 3.0], ">=", 2.0, all_pass=False) == pytest.approx(-1 / math.sqrt(2))
    assert seeds.fmt_margin(-0.7071) == "-0.71" and seeds.fmt_margin(2098.3) == "2098"
    assert seeds.fmt_margin(None) == "n/a"


def test_flags_rate_and_the_k_of_n_line():
    runs = three_seeds()
    rate = seeds.Rate.of(runs)
    assert (rate.k, rate.n, rate.control_k, rate.control_n) == (2, 3, 1, 3)
    assert rate.interval_text() == "0.21–0.94" and rate.control_text() == "control 1 of 3"
    checks = seeds.checks_over_seeds(runs)
    assert flags(rate, checks) == ["k < n", "margin < 2", "control"]
    assert worst_margin(checks, 3) == "1.00 (big)"
    assert rate_lines(runs) == ["demo: 2 of 3 seeds reproduced (95% interval 0.21–0.94); control 1 of 3 "
                                "[k < n, margin < 2, control]"]
    # every seed reproduced, wide margins, enough seeds, no control run: nothing to flag
    clean = [RunRecord.from_summary({"exp": "ok", "status": "completed", "role": "baseline", "seed": s,
                                     "config_hash": f"ok{s}",
                                     "config": {"train": {"steps": 5}, "seed": s}, "verdict": {"reproduced": True, "checks": [
                                         check("c", 10.0 + s, ">= 1", True)]}}) for s in range(3)]
    rate = seeds.Rate.of(clean)
    assert flags(rate, seeds.checks_over_seeds(clean)) == [] and rate.control_k is None
    assert rate_lines(clean) == ["ok: 3 of 3 seeds reproduced (95% interval 0.44–1.00); no control"]
    assert flags(seeds.Rate.of(clean[:2]), seeds.checks_over_seeds(clean[:2])) == ["n < 3"]


def test_the_unseen_seeds_section_gives_each_check_per_seed_with_its_spread_and_both_margins(tmp_path):
    """sections/unseen_seeds.py: the thin-margin experiments at seeds 5-9 only (the reference's
    seeds are the context of the second margin), k of n there and over every seed, FAIL marked."""
    from experiments.report.sections import unseen_seeds

    def run(seed, sinks):
        ok = sinks >= 0.005
        c = {"key": "sinks_restore", "name": "sinks restore", "kind": "delta", "passed": ok, "measured": sinks,
             "op": ">=", "threshold": 0.005, "expected": ">= 0.005"}
        s = {"key": "no_error", "name": "no error", "kind": "status", "passed": True, "measured": "completed",
             "op": "==", "threshold": "completed", "expected": "== completed"}
        return RunRecord(exp="attention_sink", status="completed", role="failure", seed=seed,
                         verdict={"reproduced": ok, "checks": [s, c]})
    values = {0: 0.06, 1: 0.05, 2: 0.07, 5: 0.003, 6: 0.06, 7: 0.04, 8: 0.05, 9: 0.08}
    runs = [run(s, v) for s, v in values.items()] + [RunRecord(exp="heads", status="completed", role="failure", seed=5,
                                                               verdict={"reproduced": True, "checks": []})]
    md = unseen_seeds.render(runs, tmp_path)
    assert "attention_sink 4 of 5 (7 of 8 over seeds 0, 1, 2, 5, 6, 7, 8, 9)" in md
    row = next(l for l in md.splitlines() if l.startswith("| attention_sink | sinks restore |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:7] == ["0.003 **FAIL**", "0.06", "0.04", "0.05", "0.08"]
    assert cells[7] == "0.0466 ± 0.029" and cells[8] == ">= 0.005" and cells[10].endswith("(n=8)")
    assert float(cells[9]) < 0 and "no error" not in md and "heads" not in md   # a status check has no margin
    assert unseen_seeds.render([run(s, v) for s, v in values.items() if s < 5], tmp_path) is None
