"""The doctor's registry: one record per check (attention_doctor/checks/catalogue.py), from which
the order, the count, the labels and the docs' tables are derived; a check function without a
record fails here; every public name has a docstring and its place in docs/doctor.md; no count of
checks is typed anywhere; the records, the schema and the signals load without torch."""
import ast
import importlib
import inspect
import re
import subprocess
import sys

import attention_doctor
from attention_doctor import checks as registry
from attention_doctor.checks import COMMON_CAUSES, COMMON_MEASURES
from attention_doctor.docs import render
from conftest import ROOT

SHARED = {"__init__", "common", "record", "catalogue", "cached_positions"}   # checks/ modules that hold no check


def _check_modules():
    return {p.stem: importlib.import_module(f"attention_doctor.checks.{p.stem}")
            for p in (ROOT / "attention_doctor" / "checks").glob("*.py") if p.stem not in SHARED}


def test_every_check_module_is_registered_and_each_check_once():
    modules = _check_modules()
    assert sorted({c.module for c in registry.REGISTRY}) == sorted(modules), \
        "a module of attention_doctor/checks/ holds no registered check (its checks would never run)"
    for c in registry.REGISTRY:   # a record's function lives in the module it names
        assert c.fn.__module__ == f"attention_doctor.checks.{c.module}" and c.fn.__name__ == c.name, c.name
    assert len(set(registry.ORDER)) == len(registry.ORDER) == len(registry.REGISTRY)
    # the smoke test first; then dropout left on in eval, which must not read as a leak
    assert list(registry.ORDER[:2]) == ["finite_output", "eval_dropout"]
    assert len({c.short for c in registry.REGISTRY}) == len(registry.REGISTRY)   # a label per check, each its own
    for c in registry.REGISTRY:
        assert c.does and c.fails_when and c.tolerance and c.applies and c.thread and c.short and c.measures, c.name
        assert not set(c.causes) & set(COMMON_CAUSES) and not set(c.measures) & set(COMMON_MEASURES), c.name


def test_every_function_a_check_module_defines_is_a_check_or_private_or_used():
    """A function of a check module that takes `ctx` alone and has no record is a check that
    would never run (unless another module calls it: amplifier, unit_qk)."""
    registered = {c.name for c in registry.REGISTRY}
    sources = "\n".join(p.read_text() for p in (ROOT / "attention_doctor").rglob("*.py"))
    for m in _check_modules().values():
        for name, fn in inspect.getmembers(m, inspect.isfunction):
            if fn.__module__ != m.__name__ or name.startswith("_") or name in registered:
                continue
            if list(inspect.signature(fn).parameters) == ["ctx"]:
                assert len(re.findall(rf"\b{name}\(", sources)) > 1, f"{m.__name__}.{name} looks like an unregistered check"


def test_the_records_the_schema_and_the_signals_load_without_torch():
    """The report and a zoo's triage read them without loading a model (PEP 562: the package's
    names are imported when first used)."""
    code = ("import sys; import attention_doctor, attention_doctor.result, attention_doctor.signals, "
            "attention_doctor.docs; from attention_doctor import Unsupported, Unreachable, TargetError, REGISTRY, "
            "DoctorResult, Row, Outcome; from attention_doctor.checks import ORDER, BY_NAME; "
            "assert BY_NAME['padding'].short == 'pad'; print('torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stderr
    from attention_doctor import Adapter, examine  # the rest, when asked for
    assert callable(examine) and isinstance(Adapter, type)


def test_docs_tables_are_the_registry():
    text = (ROOT / "docs" / "doctor.md").read_text()
    assert render(text) == text, "docs/doctor.md's tables differ from the registry: python -m attention_doctor.docs docs/doctor.md"
    for c in registry.REGISTRY:
        assert f"| {c.name} |" in text
        for name in [*c.causes, *c.measures]:
            assert f"`{name}`" in text


def _strings(node) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value}


# where a call takes the cause, by position (it may also come as cause=)
CAUSE_ARG = {"row": 4, "judged": 4, "inconclusive": 1, "na": 1, "with_bfloat16": 7, "NotPerformed": 1,
             "Unsupported": 1, "Unreachable": 1}


def cause_literals(tree) -> set[str]:
    """The strings that can reach a row's cause: the cause argument of the row helpers and the
    signals (CAUSE_ARG, positional or keyword), what is assigned to a name `cause` (a signal's
    class attribute too), and the first item of the tuples _cause()/_size() return."""
    out = set()
    pos = CAUSE_ARG
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in pos:
            i = pos[node.func.id]
            args = [a for a in node.args[i:i + 1]] + [k.value for k in node.keywords if k.arg == "cause"]
            out |= {s for a in args for s in _strings(a) if " " not in s}
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and t.id == "cause":
                    out |= {s for s in _strings(node.value) if " " not in s}
                if isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    for tt, v in zip(t.elts, node.value.elts):
                        if isinstance(tt, ast.Name) and tt.id == "cause":
                            out |= {s for s in _strings(v) if " " not in s}
        if isinstance(node, ast.FunctionDef) and node.name in ("_cause", "_size"):
            for r in ast.walk(node):
                if isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple):
                    out |= {s for s in _strings(r.value.elts[0]) if " " not in s}
        if isinstance(node, ast.FunctionDef) and node.name.endswith("_cause") and node.name != "_cause":
            out |= {s for r in ast.walk(node) if isinstance(r, ast.Return) for s in _strings(r.value) if " " not in s}
    return out


def test_every_cause_a_check_names_is_registered():
    """The cause literals of the checks' code are in a record or COMMON_CAUSES (examine also
    refuses an unregistered one under strict=True)."""
    known = set(COMMON_CAUSES) | {k for c in registry.REGISTRY for k in c.causes}
    found = set()
    declared = {"record.py", "catalogue.py"}
    for p in (ROOT / "attention_doctor").rglob("*.py"):
        if p.name not in declared:
            found |= cause_literals(ast.parse(p.read_text()))
    assert {"qk_before_scale", "mask_fill_overflow", "softmax_low_precision", "doctor_error", "adapter_error",
            "scores_unseen", "positions_from_padding", "too_large", "no_kv_cache", "shift_moves_mask",
            "target_raised", "unreachable", "not_repeatable", "reference_nonfinite", "not_amplified"} <= found   # the walk finds them
    assert found <= known, found - known


def test_no_count_of_checks_is_typed():
    """The count is derived (docs' table line, the report's cost line from the benchmark's rows) or
    not said: no number word for it anywhere, no digit for it in what people write."""
    n = len(registry.REGISTRY)
    word = re.compile(r"\b(ten|eleven|twelve|thirteen|fourteen|fifteen) (doctor )?checks\b", re.I)
    digit = re.compile(rf"\b{n} (doctor )?checks\b")
    generated = [ROOT / "README.md", ROOT / "results" / "REPORT.md", ROOT / "results" / "DOCTOR.md"]
    written = [*(ROOT / "docs").glob("*.md"), *(ROOT / "attention_doctor").rglob("*.py"),
               *(ROOT / "experiments" / "report").rglob("*.py"), *(ROOT / "doctor_lab").rglob("*.py")]
    typed = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in generated + written for m in word.finditer(p.read_text())]
    typed += [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in written for m in digit.finditer(p.read_text())]
    assert not typed, typed


def test_public_names_have_docstrings_and_their_place_in_the_docs():
    doc = (ROOT / "docs" / "doctor.md").read_text()
    for name in attention_doctor.__all__:
        obj = getattr(attention_doctor, name)
        if not isinstance(obj, tuple):
            assert (obj.__doc__ or "").strip(), f"{name} has no docstring"
        assert f"`{name}" in doc, f"{name} is not in docs/doctor.md"
    for cls in (attention_doctor.Adapter, attention_doctor.DoctorResult, attention_doctor.Row):
        for name, member in vars(cls).items():
            if name.startswith("_") or not callable(getattr(member, "fget", member)):
                continue
            assert (getattr(member, "fget", member).__doc__ or "").strip() or cls is attention_doctor.Row \
                and name in ("failed", "inconclusive", "not_applicable"), f"{cls.__name__}.{name} has no docstring"
            assert name in doc, f"{cls.__name__}.{name} is not in docs/doctor.md"
    for said in ("allow_inconclusive", "checks=", "new tokens only", "stepped before"):
        assert said in doc, said


def test_pip_install_leaves_nothing_untracked():
    p = subprocess.run(["git", "check-ignore", "-q", "--no-index", "build/lib/x.py", "attention_failure_suite.egg-info/PKG-INFO"],
                       cwd=ROOT, capture_output=True)
    lines = (ROOT / ".gitignore").read_text().splitlines()
    assert "build/" in lines and "*.egg-info/" in lines
    assert p.returncode in (0, 128)   # 128: no git here (then the lines above decide)
