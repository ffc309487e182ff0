"""The doctor's registry: one record per check, from which the order, the count and the docs'
tables are derived; a check module that is not registered fails here; every public name has a
docstring and its place in docs/doctor.md; no count of checks is typed anywhere."""
import ast
import inspect
import re
import subprocess

import attention_doctor
from attention_doctor import checks as registry
from attention_doctor.checks.common import COMMON_CAUSES
from attention_doctor.docs import render
from conftest import ROOT

SHARED = {"__init__", "common", "record", "cached_positions"}   # checks/ modules that hold no check


def test_every_check_module_is_registered_and_each_check_once():
    files = sorted(p.stem for p in (ROOT / "attention_doctor" / "checks").glob("*.py") if p.stem not in SHARED)
    assert sorted(m.__name__.rsplit(".", 1)[1] for m in registry.MODULES) == files, \
        "a module of attention_doctor/checks/ is not in MODULES (its checks would never run)"
    for m in registry.MODULES:
        assert m.CHECKS, f"{m.__name__} registers no check"
        for c in m.CHECKS:   # a record's function lives in its module
            assert c.fn.__module__ == m.__name__, c.name
    assert len(set(registry.ORDER)) == len(registry.ORDER) == len(registry.REGISTRY)
    assert registry.ORDER[0] == "eval_dropout"   # dropout left on in eval must not read as a leak
    for c in registry.REGISTRY:
        assert c.does and c.fails_when and c.tolerance and c.applies and c.thread, c.name


def test_every_function_a_check_module_defines_is_a_check_or_private_or_used():
    """A function of a check module that takes `ctx` alone and is not registered is a check that
    would never run (unless another module calls it: amplifier, unit_qk)."""
    registered = {c.fn for c in registry.REGISTRY}
    sources = "\n".join(p.read_text() for p in (ROOT / "attention_doctor").rglob("*.py"))
    for m in registry.MODULES:
        for name, fn in inspect.getmembers(m, inspect.isfunction):
            if fn.__module__ != m.__name__ or name.startswith("_") or fn in registered:
                continue
            if list(inspect.signature(fn).parameters) == ["ctx"]:
                assert len(re.findall(rf"\b{name}\(", sources)) > 1, f"{m.__name__}.{name} looks like an unregistered check"


def test_docs_tables_are_the_registry():
    text = (ROOT / "docs" / "doctor.md").read_text()
    assert render(text) == text, "docs/doctor.md's tables differ from the registry: python -m attention_doctor.docs docs/doctor.md"
    for c in registry.REGISTRY:
        assert f"| {c.name} |" in text
        for cause in c.causes:
            assert f"`{cause}`" in text


def _strings(node) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value}


def cause_literals(tree) -> set[str]:
    """The strings that can reach a row's cause: the cause argument of row() / inconclusive()
    (positional or keyword), what is assigned to a variable named `cause`, and the first item of
    the tuples _cause()/_size() return."""
    out = set()
    pos = {"row": 5, "inconclusive": 2}
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
    return out


def test_every_cause_a_check_names_is_registered():
    """The cause literals of the checks' code are in a record or COMMON_CAUSES (examine also
    refuses an unregistered one under strict=True)."""
    known = set(COMMON_CAUSES) | {k for c in registry.REGISTRY for k in c.causes}
    found = set()
    for p in [*(ROOT / "attention_doctor" / "checks").glob("*.py"), ROOT / "attention_doctor" / "examine.py"]:
        found |= cause_literals(ast.parse(p.read_text()))
    assert {"qk_before_scale", "mask_fill_overflow", "softmax_low_precision", "doctor_error", "scores_unseen",
            "positions_from_padding", "too_large"} <= found   # the walk finds them
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
