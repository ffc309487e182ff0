"""The twelve checks, in the order they run (eval_dropout first: dropout left on in eval must not
read as a leak). Each is a function of the context returning one result row."""
from attention_doctor.checks.amplified import amplified_logits
from attention_doctor.checks.batching import batch_independence, fully_masked_rows, padding
from attention_doctor.checks.causality import eval_dropout, future_leak, kv_cache, self_visibility
from attention_doctor.checks.common import Context
from attention_doctor.checks.paths import path_agreement
from attention_doctor.checks.precision import long_positions, low_precision
from attention_doctor.checks.scale import score_scale

CHECKS = {f.__name__: f for f in (eval_dropout, future_leak, self_visibility, kv_cache, batch_independence,
                                   padding, fully_masked_rows, amplified_logits, low_precision, long_positions,
                                   score_scale, path_agreement)}
__all__ = ["CHECKS", "Context"]
