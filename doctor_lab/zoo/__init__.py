"""The zoo: transformers' causal-LM architectures examined by the attention doctor
(`python -m doctor_lab.zoo`; shrink.yaml says how each is made small)."""
