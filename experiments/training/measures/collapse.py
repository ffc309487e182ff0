"""Entropy collapse per head (Zhai et al. 2023), read from the run's diagnostic rows
(attn/entropy_head/L<i>/H<j>, logged by the Recorder), wired through
`exp.measures: ["per_head_collapse"]`."""
import math

from experiments.facts import COLLAPSED_NATS


def _head_cols(row: dict) -> list[str]:
    return sorted(k for k in row if k.startswith("attn/entropy_head/"))


def per_head(trainer, cfg) -> dict:
    """The lowest head entropy at the last diagnostic step, the share of heads below COLLAPSED_NATS
    there, the first step where some head fell below it and the max logit (any layer) at that
    step, and how much the experiment's loss (exp.loss_metric) moved after it (max - min)."""
    rows = [r for r in trainer.res.rows if _head_cols(r)]
    if not rows:
        return {}
    cols = _head_cols(rows[-1])
    last = [rows[-1][c] for c in cols]
    out = {"collapse/min_head_entropy": min(last),
           "collapse/heads_collapsed": sum(e < COLLAPSED_NATS for e in last) / len(last)}
    first = next((r for r in rows if min(r[c] for c in cols) < COLLAPSED_NATS), None)
    logit = lambda r: max(v for k, v in r.items() if k.startswith("attn/max_score/"))  # noqa: E731
    out["collapse/step"] = float(first["step"]) if first else math.nan
    out["collapse/max_logit_at_collapse"] = logit(first) if first else math.nan
    out["collapse/max_logit"] = max(logit(r) for r in rows)
    if first:
        loss = cfg["exp"]["loss_metric"]  # loss/copy; on text loss/train
        after = [r[loss] for r in trainer.res.rows if r["step"] >= first["step"] and loss in r]
        out["collapse/loss_range_after"] = max(after) - min(after)
    return out
