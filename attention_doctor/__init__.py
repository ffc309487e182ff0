"""The attention doctor: the catalogue's bugs looked for in anyone's attention.

    from attention_doctor import examine
    result = examine(model)            # a torch module: an LM, a layer, a transformers causal LM
    print(result.table())
    result.assert_healthy()            # in a test: fails with the table

Depends on torch only (transformers and this project's Hydra config are imported only for the
targets that need them). docs/doctor.md: the checks, their tolerances, the adapter protocol.
"""
from attention_doctor.adapters import Adapter, Layer, TargetError, TorchMHA, Unsupported
from attention_doctor.conventions import CallableLM
from attention_doctor.dispatch import adapt
from attention_doctor.examine import examine
from attention_doctor.result import DoctorResult, Row


def assert_healthy(model, allow=(), **kw) -> DoctorResult:
    """One line for a user's test suite: examine the model, fail with the table if a check failed."""
    return examine(model, **kw).assert_healthy(allow=allow)


__all__ = ["examine", "assert_healthy", "DoctorResult", "Row", "Adapter", "CallableLM", "Layer", "TorchMHA",
           "Unsupported", "TargetError", "adapt"]
