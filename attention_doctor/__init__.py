"""The attention doctor: the catalogue's bugs looked for in anyone's attention.

    from attention_doctor import examine
    result = examine(model)            # a torch module: an LM, a layer, a transformers causal LM
    print(result.table())
    result.assert_healthy()            # in a test: fails with the table (on a fail or an inconclusive)

Depends on torch only (transformers and this project's Hydra config are imported only for the
targets that need them). docs/doctor.md: the outcomes and exit codes, the checks, their
tolerances, the adapter protocol.
"""
from attention_doctor.adapters import Adapter, Layer, TargetError, TorchMHA, Unreachable, Unsupported
from attention_doctor.checks import REGISTRY
from attention_doctor.conventions import CallableLM
from attention_doctor.dispatch import adapt
from attention_doctor.examine import examine
from attention_doctor.result import DoctorResult, Row


def assert_healthy(model, allow=(), allow_inconclusive=(), **kw) -> DoctorResult:
    """One line for a user's test suite: examine(model, **kw), then raise AssertionError with the
    table if a check failed (unless named in `allow`) or was inconclusive (unless named in
    `allow_inconclusive`, or that is True). Returns the result."""
    return examine(model, **kw).assert_healthy(allow=allow, allow_inconclusive=allow_inconclusive)


__all__ = ["examine", "assert_healthy", "DoctorResult", "Row", "Adapter", "CallableLM", "Layer", "TorchMHA",
           "Unsupported", "Unreachable", "TargetError", "adapt", "REGISTRY"]
