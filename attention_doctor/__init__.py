"""The attention doctor: the catalogue's bugs looked for in anyone's attention.

    from attention_doctor import examine
    result = examine(model)            # a torch module: an LM, a layer, a transformers causal LM
    print(result.table())
    result.assert_healthy()            # in a test: fails with the table (on a fail or an inconclusive)
    examine(model, baseline="attention_baseline.json")   # expected outcomes as data (attention_doctor.baseline)

In a pytest suite, the plugin the install brings (attention_doctor/pytest_plugin.py): one test per check.

Depends on torch only (transformers and this project's Hydra config are imported only for the
targets that need them); the names below are imported when first used (PEP 562), so that
`attention_doctor.result`, `.signals` and `.checks` (the schema, the signals, the check records)
load without torch. docs/doctor.md: the outcomes and exit codes, the checks, their tolerances,
the adapter protocol.
"""
import importlib

_WHERE = {   # public name -> the module that defines it
    "examine": "attention_doctor.examination", "DoctorResult": "attention_doctor.result", "Row": "attention_doctor.result",
    "Outcome": "attention_doctor.result", "Adapter": "attention_doctor.adapters", "Layer": "attention_doctor.adapters",
    "TorchMHA": "attention_doctor.adapters", "CallableLM": "attention_doctor.conventions",
    "Unsupported": "attention_doctor.signals", "Unreachable": "attention_doctor.signals",
    "TargetError": "attention_doctor.signals", "adapt": "attention_doctor.dispatch",
    "REGISTRY": "attention_doctor.checks", "Baseline": "attention_doctor.baseline", "Expected": "attention_doctor.baseline",
}


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module 'attention_doctor' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_WHERE))


def assert_healthy(model, allow=(), allow_inconclusive=(), **kw):
    """One line for a user's test suite: examine(model, **kw), then raise AssertionError with the
    table if a check failed (unless named in `allow`) or was inconclusive (unless named in
    `allow_inconclusive`, or that is True). Returns the result."""
    from attention_doctor.examination import examine
    return examine(model, **kw).assert_healthy(allow=allow, allow_inconclusive=allow_inconclusive)


__all__ = ["examine", "assert_healthy", "DoctorResult", "Row", "Outcome", "Adapter", "CallableLM", "Layer", "TorchMHA",
           "Unsupported", "Unreachable", "TargetError", "adapt", "REGISTRY", "Baseline", "Expected"]
