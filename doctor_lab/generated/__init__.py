"""The generated styles bed: attention implementations composed from independent axes (score
layout and notation, q/k/v layout, mask encoding and where it is made, normalisation, positions,
cache convention, init, size) as small causal LMs, with each catalogue bug planted where it is
meaningful, every expected outcome derived from the records (records.py: one record per axis value
and per bug; combos.py: validity and expectations; attention.py, positions.py, lm.py: the model;
judge.py: a result against its expectation; run.py: the runner; triage.py: the misses' reasons).

    python -m doctor_lab.generated --sample 2400 --workers 1 --out /tmp/gen
"""
