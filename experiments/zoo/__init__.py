"""The zoo: transformers' causal-LM architectures examined by the attention doctor
(`python -m experiments.zoo`; shrink.yaml says how each is made small)."""
