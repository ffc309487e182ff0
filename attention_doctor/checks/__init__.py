"""The registry: one record per check (checks/record.py), from which the order the checks run in,
their count and docs/doctor.md's table are derived. A check is a module of this package whose
CHECKS lists its records; MODULES says the order (eval_dropout first: dropout left on in eval
must not read as a leak). A new check: one module with its function and record, its line here,
its docs (`python -m attention_doctor.docs docs/doctor.md` writes the table) and its test
(tests/test_doctor_registry.py fails while a module of this package is not registered)."""
from attention_doctor.checks import amplified, batching, causality, paths, precision, scale
from attention_doctor.checks.record import Check

MODULES = (causality, batching, amplified, precision, scale, paths)
REGISTRY: tuple[Check, ...] = tuple(c for m in MODULES for c in m.CHECKS)
ORDER: tuple[str, ...] = tuple(c.name for c in REGISTRY)
BY_NAME: dict[str, Check] = {c.name: c for c in REGISTRY}
__all__ = ["Check", "REGISTRY", "ORDER", "BY_NAME", "MODULES"]
