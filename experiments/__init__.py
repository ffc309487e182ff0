"""Training loop, verdicts, report, benchmarks and Hydra callbacks."""
