"""Text signatures in the corpus's own units: every threshold on a loss is a multiple of what the
corpus gives (`gain`, attention's gain; `floor`; `control`), so a corpus whose losses are all
scaled by one factor gets the same verdict (issue 47: a threshold in nats said more about the
corpus than about the bug)."""
import math

import pytest
import yaml

from experiments.judging.checks import signature
from experiments.judging.expressions import evaluate, names_used
from experiments.judging.verdict import RunView, with_gain
from experiments.judging.verdict import evaluate as judge
from experiments.on_text import CONF

# metrics measured in nats per character: a threshold on them must scale with the corpus
NATS = ("loss/", "gen/gap", "gen/prefix_loss", "pad/left_minus_right", "sample/trigram_nll")


def in_nats(metric: str | None) -> bool:
    return bool(metric) and metric.startswith(NATS)


def text_checks() -> dict:
    """{version: {check: fields}} of every conf/on_text overlay's own checks."""
    out = {}
    for p in sorted((CONF / "on_text").glob("*.yaml")):
        spec = (yaml.safe_load(p.read_text()) or {}).get("exp") or {}
        if spec.get("checks"):
            out[p.stem] = spec["checks"]
    return out


def test_every_text_threshold_on_a_loss_scales_with_the_corpus():
    """A threshold on a loss evaluated on a corpus whose floor, control and gain are k times
    another's is k times that corpus's threshold: no constant in nats hides in it."""
    names = {"floor": 2.5, "control": 1.9, "gain": 0.6, "ln_V": math.log(65), "V": 65, "d_k": 64, "steps": 500,
             "steps_done": 500, "log_every": 10}
    seen = 0
    for version, checks in text_checks().items():
        for key, c in checks.items():
            if not in_nats(c.get("metric")):
                continue
            # a ratio (and a plateau's step ratio) has no unit; its level, a loss, does
            for f in {"threshold": ("value",), "delta": ("value",), "plateau": ("level",)}.get(c["kind"], ()):
                if c.get(f) is None:
                    continue
                seen += 1
                used = names_used(c[f])
                # a sign (0) scales too; any other number is nats
                assert used <= {"floor", "control", "gain"} and (used or c[f] == 0), (version, key, c[f])
                for k in (0.3, 2.7):
                    scaled = {**names, **{n: k * names[n] for n in ("floor", "control", "gain")}}
                    assert evaluate(c[f], scaled) == pytest.approx(k * evaluate(c[f], names)), (version, key, c[f])
    assert seen >= 15, seen   # the text versions' loss checks were found


def view(losses: dict, context: dict, k: float) -> RunView:
    """A run whose loss-valued finals (and the expression names) are scaled by k."""
    final = {m: (k * v if in_nats(m) else v) for m, v in losses.items()}
    ctx = {n: (k * v if n in ("floor", "control", "gain") else v) for n, v in context.items()}
    return RunView(status="completed", final=final, rows=[{"step": 500, **final}], context=ctx)


@pytest.mark.parametrize("k", [0.35, 1.0, 3.0])
def test_a_corpus_scaled_by_any_factor_gets_the_same_verdict(k):
    """head_merge_no_transpose's text signature, judged on Shakespeare's seed-0 numbers, then on
    the same numbers scaled (a corpus with a third of the entropy, or three times it): the
    thresholds follow the corpus, the verdict does not move. A threshold in nats would flip (the
    C-header case of issue 47)."""
    spec = yaml.safe_load((CONF / "on_text" / "head_merge_no_transpose.yaml").read_text())["exp"]
    checks = signature({"name": "head_merge_no_transpose", **spec})
    floor, healthy = 2.492, 1.893
    context = {"floor": floor, "control": healthy}
    ctx = with_gain(context, {"status": "completed", "final": {"loss/train": floor},
                              "text_model": {"status": "completed", "final": {"loss/train": healthy}}})
    assert ctx["gain"] == pytest.approx(floor - healthy)
    run = {"loss/train": 1.245, "gen/gap": 1.29, "gen/prefix_loss": 2.54, "sample/repeat_frac": 0.3,
           "sample/trigram_nll": 2.0}
    control = {"loss/train": healthy, "gen/gap": 0.04, "gen/prefix_loss": 1.90, "sample/repeat_frac": 0.1,
               "sample/trigram_nll": 2.4}
    v = judge(checks, view(run, ctx, k), view(control, ctx, k))
    assert v["reproduced"], [(c["key"], c["measured"], c["threshold"]) for c in v["checks"]]
    assert {c["key"]: c["passed"] for c in v["checks"]} == {
        c["key"]: c["passed"] for c in judge(checks, view(run, ctx, 1.0), view(control, ctx, 1.0))["checks"]}
    assert {c["key"]: c.get("rule") for c in v["checks"]}["val_below_control"] == "-0.5 * gain"
    # the same cheat on a corpus with less to gain (gain halved, losses as they are): a smaller
    # cheat, measured in that corpus's gain, still reproduces; one of a tenth of the gain does not
    small = {**ctx, "gain": ctx["gain"] / 2}
    weak = {**run, "loss/train": healthy - 0.1 * ctx["gain"]}
    assert not judge(checks, view(weak, small, 1.0), view(control, small, 1.0))["reproduced"]


def test_gain_is_unknown_where_the_floor_or_the_text_model_did_not_complete():
    floor = {"status": "completed", "final": {"loss/train": 2.5}, "text_model": {"status": "diverged", "final": {}}}
    assert "gain" not in with_gain({}, floor) and "gain" not in with_gain({}, None)
    with pytest.raises(ValueError, match="gain is not known for this run"):
        evaluate("0.5 * gain", {"floor": 2.5})


def test_a_check_in_gains_needs_a_floor_and_says_so_before_training(tmp_path):
    """`gain` on the copy task (no floor, no text model): one line at preflight, nothing trained."""
    from experiments.config import compose
    from experiments.training.runner import needs_text_model, preflight
    cfg = compose(["+exp=no_scaling", "exp.checks.score_std_large.value=0.5 * gain", f"results_dir={tmp_path}"])
    assert needs_text_model(signature(cfg["exp"]))
    with pytest.raises(ValueError, match="needs a no-attention floor"):
        preflight(cfg)


def test_the_corpora_section_shows_each_check_at_its_worst_seed_with_its_threshold_as_written(tmp_path):
    """The report's table per corpus (sections/corpora.py): k of n, the worst seed of each gating
    check with the threshold in the corpus's units as written, FAIL where it failed, the gain."""
    from experiments.records import RunRecord
    from experiments.report.sections import corpora

    def run(data, seed, measured, gain):
        ok = measured <= -0.5 * gain
        check = {"key": "val_below_control", "name": "val", "kind": "delta", "passed": ok, "measured": measured,
                 "op": "<=", "threshold": -0.5 * gain, "rule": "-0.5 * gain", "expected": f"<= {-0.5 * gain:g}"}
        ro = {"key": "sample_trigram", "name": "tri", "kind": "delta", "passed": True, "measured": 1.0,
              "report_only": True, "op": ">=", "threshold": 0, "expected": ">= 0"}
        return RunRecord(exp="head_merge_no_transpose", status="completed", role="failure", seed=seed,
                         config={"data": {"name": data}}, context={"gain": gain},
                         verdict={"reproduced": ok, "checks": [check, ro]})
    runs = [run("chichewa_char", s, m, 0.8) for s, m in ((0, -0.9), (1, -0.35), (2, -0.6))]
    runs += [run("shakespeare_char", s, -0.67, 0.6) for s in (0, 1, 2)]
    md = corpora.render(runs, tmp_path)
    assert md.index("### tiny Shakespeare") < md.index("### Chichewa")   # the reference corpus first
    chichewa = md[md.index("### Chichewa"):]
    assert "**0 of 1 text versions reproduce in every seed**" in chichewa and "0.800, 0.800, 0.800" in chichewa
    row = next(l for l in chichewa.splitlines() if l.startswith("| head_merge_no_transpose |"))
    assert "| 2 of 3 |" in row and "val_below_control -0.35 (<= -0.4 = -0.5 * gain; seed 1) **FAIL**" in row
    assert "sample_trigram" not in row   # report-only checks are not the signature
    assert corpora.render([r for r in runs if r.seed is None], tmp_path) is None


def test_every_text_version_passes_preflight_and_only_those_in_gains_train_the_text_model():
    """The status checks' words (completed, error) are no expressions: every version composes and
    passes preflight on each corpus's task; the text model is trained only for a check in gains."""
    from experiments.config import compose
    from experiments.training.runner import needs_text_model, preflight
    lines = {"fully_masked_rows", "left_padding_positions", "mask_broadcast", "mask_broadcast_shape_error",
             "mask_min_overflow"}
    in_gains = set()
    for p in sorted((CONF / "on_text").glob("*.yaml")):
        cfg = compose([f"+exp={p.stem}", f"data=python_source_{'lines' if p.stem in lines else 'char'}"])
        preflight(cfg)
        if needs_text_model(signature(cfg["exp"])):
            in_gains.add(p.stem)
    assert in_gains == {"entropy_collapse", "finite_mask_leak", "head_merge_no_transpose", "logit_growth",
                        "causal_kv_cache"}
