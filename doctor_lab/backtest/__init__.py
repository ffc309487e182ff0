"""The backtest: the attention regressions transformers shipped (record.yaml, one entry each, each
with a standalone repro in repros/), and the releases they need, installed side by side (releases.py).
`python -m doctor_lab.backtest.verify` checks every repro on the release before, the introducing
release and the fixing release."""
