"""Judging a run: its signature parsed from the config (checks), measured on the run and on its
control (verdict), thresholds as small arithmetic (expressions). No torch here."""
