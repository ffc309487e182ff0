"""Numbers that training code and the report both use, each defined once. The report loads no
torch, so it cannot import the training modules that apply them; both import them from here."""

# entropy collapse (measures/collapse.py, report/sections/collapse.py): a head whose mean row
# entropy is below this many nats attends one-hot
COLLAPSED_NATS = 0.1

# where the query of two_facts looks (measures/heads.py fact_weights, report/sections/heads.py):
READS_FACTS = 0.5   # a head reads the facts when at least this share of its weight is on them
MIXES = 0.25        # ... and mixes them when each fact gets at least this share
EVEN_TOL = 0.1      # a mix is about 50/50 when the two shares differ by less than this


def about_even(share_a: float, share_b: float) -> bool:
    """A head that mixes the two facts about 50/50 (the one-head interference picture)."""
    return abs(share_a - share_b) < EVEN_TOL and min(share_a, share_b) >= MIXES

# seeds no threshold was set on (experiments/reference.py's part seeds_5_9, report/sections/
# unseen_seeds.py): the experiments the catalogue flagged `margin < 2` or `k < n`, and the baseline
UNSEEN_SEEDS = (5, 6, 7, 8, 9)
THIN_MARGIN_EXPS = ("attention_sink", "baseline", "finite_mask_leak", "mask_min_overflow", "no_scaling",
                    "qk_fp16_overflow")
