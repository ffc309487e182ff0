"""The attention doctor's lab: the evidence that the doctor finds what it claims (validation.py,
references.py, styles/), the zoos that run it over third-party attention (zoo/: transformers,
zoo_xt/: x-transformers, zoo_diffusers/: diffusers; zoo/findings.py: the findings' repros and
patches) and their report (report/: results/DOCTOR.md). Run from a clone, like experiments/; it
imports attention_doctor and the suite's io and markdown helpers, and nothing imports it."""
