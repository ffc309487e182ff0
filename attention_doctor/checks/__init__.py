"""The check registry: one record per check (record.Check, declared in catalogue.py), from which
the order the checks run in, their count, their labels and docs/doctor.md's tables are derived.
Each record names the module of this package that holds its function (imported when the check
runs). Torch-free: `from attention_doctor.checks import REGISTRY` loads no model code."""
from attention_doctor.checks.catalogue import BY_NAME, ORDER, REGISTRY
from attention_doctor.checks.record import COMMON_CAUSES, COMMON_MEASURES, Cause, Check

__all__ = ["Check", "Cause", "REGISTRY", "ORDER", "BY_NAME", "COMMON_CAUSES", "COMMON_MEASURES"]
