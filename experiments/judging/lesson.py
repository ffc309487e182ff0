"""The lesson's sentence, judged on one run of `+exp=lesson_scale`: "the loss starts at 10.4, drops
to 9.8 in the first fifty steps, and then stops. Flat." 10.4 is ln V for V = 32,768; 9.8 is 0.6
nats below it. Three clauses, each measured on the run's own logged train loss:

  start  |L(0) - ln V| <= START_TOL (0.25 nats). L(0) is the step-0 batch's loss; the lesson's "10.4"
         is ln V to one decimal, and 0.25 nats of KL from uniform still means near-uniform
         output. An init whose logits are large at step 0 (tied N(0, 1) embeddings) fails here.
  at 50  |L(50) - (ln V - DROP)| <= DROP_TOL: the lesson's drop of DROP = 0.6 nats, give or take
         half of it (0.3). L(50): the mean of the losses logged at steps 50-60 (one batch's loss
         is noisy; ten batches damp it).
  flat   L(50) - L(end) <= FLAT_TOL (0.2 nats, a third of the lesson's first drop): after step 50
         the loss falls by less than that to the end. L(end): the mean of the losses logged in the
         last fifth of the run.

The sentence holds where all three hold; `shape` (start and flat, whatever the level at step 50)
is reported beside it, so a run that learns the unigram distribution at once and then stalls is
told apart from one that learns. The plateau: from step 50 until L(s), the mean over steps s to
s + WINDOW measured as L(50) is, first falls FLAT_TOL below L(50), s taken past L(50)'s own steps
so the two means share no batch (its length; `capped` when that never happens within the run), and
its level (the mean loss over it). These tolerances were fixed from the lesson's own
numbers before any run, not from the runs.
"""
import math
from dataclasses import dataclass

DROP = 0.6          # the lesson: 10.4 -> 9.8
START_TOL = 0.25
DROP_TOL = 0.3
FLAT_TOL = 0.2
LANDMARK = 50       # "in the first fifty steps"
WINDOW = 10         # L(50): the mean of the losses logged at steps 50 to 50 + WINDOW
END_FRACTION = 0.2  # L(end): the mean over the last fifth of the run


@dataclass(frozen=True)
class Clause:
    name: str
    measured: float
    target: str        # the threshold as the report prints it
    held: bool


@dataclass(frozen=True)
class LessonVerdict:
    start: Clause
    at_50: Clause
    flat: Clause
    plateau_steps: float   # steps after LANDMARK before the loss leaves the plateau
    plateau_capped: bool   # still on it at the end of the run: the true plateau is longer
    plateau_level: float
    end_level: float
    diverged_at: int | None = None

    @property
    def held(self) -> bool:
        return self.start.held and self.at_50.held and self.flat.held and self.diverged_at is None

    @property
    def shape(self) -> bool:
        """Starts at chance and then flat, at whatever level it reached by step 50."""
        return self.start.held and self.flat.held and self.diverged_at is None


def _mean(vals) -> float:
    vals = list(vals)
    return sum(vals) / len(vals) if vals else math.nan


def judge(series: list[tuple[int, float]], ln_v: float, steps: int) -> LessonVerdict:
    """The sentence on one run: `series` its (step, train loss) as logged, `steps` its budget. A
    non-finite loss is a divergence: every clause from it on fails, and the verdict says where."""
    series = sorted((int(s), float(v)) for s, v in series)
    bad = next((s for s, v in series if not math.isfinite(v)), None)
    finite = [(s, v) for s, v in series if bad is None or s < bad]
    l0 = next((v for s, v in finite if s == 0), math.nan)
    l50 = _mean(v for s, v in finite if LANDMARK <= s <= LANDMARK + WINDOW)
    last = max((s for s, _ in series), default=0)
    end_from = last - END_FRACTION * max(last, 1)
    l_end = math.nan if bad is not None else _mean(v for s, v in finite if s >= end_from)
    target = ln_v - DROP
    start = Clause("start", l0, f"{ln_v:.2f} ± {START_TOL:g}", abs(l0 - ln_v) <= START_TOL)
    at_50 = Clause("at 50", l50, f"{target:.2f} ± {DROP_TOL:g}", abs(l50 - target) <= DROP_TOL)
    flat = Clause("flat", l50 - l_end, f"fall <= {FLAT_TOL:g}", l50 - l_end <= FLAT_TOL)  # NaN: False
    after = [(s, v) for s, v in finite if s >= LANDMARK]
    window = lambda t: _mean(v for s, v in after if t <= s <= t + WINDOW)  # noqa: E731  L(t), as L(50)
    left = next((s for s, _ in after if s > LANDMARK + WINDOW and window(s) < l50 - FLAT_TOL), None)  # windows apart
    end = left if left is not None else (bad if bad is not None else steps)
    level = _mean(v for s, v in after if s <= end)
    return LessonVerdict(start, at_50, flat, plateau_steps=max(0, end - LANDMARK), plateau_capped=left is None and bad is None,
                         plateau_level=level, end_level=l_end, diverged_at=bad)
