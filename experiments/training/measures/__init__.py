"""What an experiment measures after training, by the name `exp.measures` gives it: each
fn(trainer, cfg) returns {metric: value}, merged into the run's final metrics where checks read
them (KV-cache bytes, decode time, time per step, ...). A new measure is a function in one of these
modules and a line in MEASURES."""
from experiments.training.measures import catalogue, collapse, heads, logit_fixes, positions, rank, text

MEASURES = {
    "row_sums": catalogue.row_sums,
    "entropy_vs_uniform": catalogue.entropy_vs_uniform,
    "cost_vs_dot": catalogue.cost_vs_dot,
    "mask_leak": catalogue.mask_leak,
    "first_token_loss": catalogue.first_token_loss,
    "fp16_attention": catalogue.fp16_attention,
    "mask_combine_rows": catalogue.mask_combine_rows,
    "per_head_collapse": collapse.per_head,
    "fact_weights": heads.fact_weights,
    "param_accounting": heads.param_accounting,
    "kv_cache_cost": heads.kv_cache,
    "cost_vs_no_fix": logit_fixes.cost_vs_no_fix,
    "rope_precision": positions.rope_precision,
    "padding_sides": positions.padding_sides,
    "cache_agreement": positions.cache_agreement,
    "window_eviction": positions.window_eviction,
    "rank_residuals": rank.rank_residuals,
    "greedy_sample": text.greedy_sample,
}
