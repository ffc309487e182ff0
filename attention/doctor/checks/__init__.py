"""The twelve checks, in the order they run (eval_dropout first: dropout left on in eval must not
read as a leak). Each is a function of the context returning one result row."""
from attention.doctor.checks.amplified import amplified_logits
from attention.doctor.checks.batching import batch_independence, fully_masked_rows, padding
from attention.doctor.checks.causality import eval_dropout, future_leak, kv_cache, self_visibility
from attention.doctor.checks.common import Context
from attention.doctor.checks.paths import path_agreement
from attention.doctor.checks.precision import long_positions, low_precision
from attention.doctor.checks.scale import score_scale

CHECKS = {f.__name__: f for f in (eval_dropout, future_leak, self_visibility, kv_cache, batch_independence,
                                   padding, fully_masked_rows, amplified_logits, low_precision, long_positions,
                                   score_scale, path_agreement)}
__all__ = ["CHECKS", "Context"]
