"""One record per check, as PyTorch's OpInfo has one per operator: everything said about a check,
and where its function lives. The order the checks run in, their count, the docs tables
(docs/doctor.md), the rows' experiment and thread, the short labels of narrow tables, the causes a
row may name and the measurements it may carry are derived from these records
(attention_doctor.checks.REGISTRY), never typed twice. Torch-free: the report and a zoo's triage
read the records without loading a model."""
import importlib
from dataclasses import dataclass, field
from typing import Callable

from attention_doctor.result import FAIL, INCONCLUSIVE, NA, WARN, Outcome


@dataclass(frozen=True)
class Cause:
    """A cause a row may name: the outcome it comes with, and what it means."""
    outcome: Outcome
    meaning: str


def fails(meaning: str) -> Cause:
    return Cause(FAIL, meaning)


def warns(meaning: str) -> Cause:
    return Cause(WARN, meaning)


def not_applicable(meaning: str) -> Cause:
    return Cause(NA, meaning)


def cannot(meaning: str) -> Cause:
    """The cause of an inconclusive row: what kept the doctor from performing the check."""
    return Cause(INCONCLUSIVE, meaning)


@dataclass(frozen=True)
class Check:
    """A check of the doctor.

    name: the check's name, and its function's in attention_doctor.checks.<module> (ctx -> Row);
    short: its label in narrow tables; does: what it runs on the target; fails_when: what makes it
    fail; tolerance: its tolerance and why that value; applies: where it applies (elsewhere `n/a`,
    saying what would enable it); thread: the public thread where the failure shipped (owner/repo
    #N); targets: the catalogue experiments (conf/exp/NAME.yaml) whose failure value it targets,
    the first shown as `+exp=NAME`; causes: {cause: Cause} its rows may name (beside
    COMMON_CAUSES); measures: {measurement: what it is} its rows may carry (beside COMMON_MEASURES)."""
    name: str
    module: str
    short: str
    does: str
    fails_when: str
    tolerance: str
    applies: str
    thread: str
    targets: tuple[str, ...] = ()
    causes: dict[str, Cause] = field(default_factory=dict)
    measures: dict[str, str] = field(default_factory=dict)

    @property
    def fn(self) -> Callable:
        """The check itself, ctx -> Row (imported when asked for: the checks need torch)."""
        return getattr(importlib.import_module(f"attention_doctor.checks.{self.module}"), self.name)

    @property
    def experiment(self) -> str:
        """The catalogue experiment that reproduces this check's failure ("" if none)."""
        return self.targets[0] if self.targets else ""

    def cause(self, name: str) -> Cause | None:
        """The cause `name` as this check's record or COMMON_CAUSES declares it (None: undeclared)."""
        return self.causes.get(name) or COMMON_CAUSES.get(name)

    def measure(self, name: str) -> str | None:
        """What the measurement `name` is, as declared (None: undeclared)."""
        return self.measures.get(name) or COMMON_MEASURES.get(name)


# The causes every check may name (a check's own are in its record)
COMMON_CAUSES = {
    "target_raised": fails("the target's own forward (prefill, step) raised on a valid input the check gave it"),
    "unsupported": not_applicable("an Adapter said the target lacks what the check needs (Unsupported without a "
                                  "cause of its own)"),
    "no_kv_cache": not_applicable("the target has no KV cache (no prefill and step)"),
    "no_padding_mask": not_applicable("its forward takes no padding mask"),
    "no_positions": not_applicable("it takes no position ids, or not as far as the check needs"),
    "no_paths": not_applicable("it has no switch between attention paths"),
    "not_causal": not_applicable("a bidirectional target cannot leak the future"),
    "no_attention": not_applicable("no attention weights anywhere in its forward, seen at the dispatcher "
                                   "(attention_doctor/mixing.py: no softmax, SDPA or flex op, no token-by-token "
                                   "matrix, scripted code included, and no op the doctor cannot look into): a "
                                   "state-space or recurrent mixer, or a linear attention that never forms its "
                                   "weights, has no scores to examine"),
    "doctor_error": cannot("the doctor's own code raised (a built-in adapter outside the target's forward, a probe "
                           "or hook inside it): a doctor bug; strict=True re-raises it"),
    "adapter_error": cannot("a user-written Adapter's own code raised outside the target's forward; strict=True "
                            "re-raises it"),
    "not_repeatable": cannot("eval outputs differ from call to call (eval_dropout failed), so no comparison holds"),
    "reference_nonfinite": cannot("the reference side of a comparison (the target's own output, or float64's) is "
                                  "not finite: no comparison holds"),
    "scores_unseen": cannot("no attention call was seen (no softmax or SDPA call; a fused kernel): the scores, "
                            "weights or q and k it needs are out of sight"),
    "not_amplified": cannot("scaling q and k did not raise the scores (normalised or capped scores, or a q/k layout "
                            "read wrong)"),
    "scores_zero": cannot("every visible score is 0 at init (a scale or temperature initialised to zero): no factor "
                          "on q and k moves them, so they cannot be amplified"),
    "no_qk_layout": cannot("no verified q/k layout (attention_doctor/layouts.py): q and k cannot be made "
                           "unit-variance where they are made"),
    "unreachable": cannot("the target may have the interface (a cache of its own kind, positions or a path it "
                          "rejects) but the doctor cannot drive it; an Adapter can"),
    "insensitive_outputs": cannot("no later output moves when position 0's input changes, and the model has no "
                                  "all-zero weight matrix the doctor could fill in its copy "
                                  "(attention_doctor/sensitivity.py): what the outputs do not show was not looked at"),
    "part_not_run": cannot("the part that ran held, another part of the check could not run (named in the "
                           "row's reason and measurements['not_run'])"),
    "adapter_contract": cannot("an adapter returned something its contract does not allow"),
    "layout_unmeasured": cannot("an attention call's scores have more than one axis as long as the sequence, and "
                                "which holds the queries could not be measured (attention_doctor/score_axes.py): "
                                "not read in an assumed layout"),
    "readings_disagree": cannot("what the doctor read inside the forward (a mask, weights, a row sum, a hull) says "
                                "fail, and what the outputs do (the model's, or the call's own) does not: both named "
                                "in the reason; no fail without a witness"),
}

# The measurements any row may carry (a check's own are in its record)
COMMON_MEASURES = {
    "error": "the exception in one line (type: message) of a target that raised, of the library's save or "
             "load (config_roundtrip's not_reloaded), or of the doctor's or an adapter's code",
    "limit": "the number the check's main measurements are held to",
    "not_run": "the parts of the check that could not run (the row is inconclusive unless a part that ran failed)",
    "not_applicable": "the parts that do not apply to the target by nature (the rest was judged)",
}
