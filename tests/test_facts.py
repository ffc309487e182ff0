"""A number the training code and the report share is defined once (experiments/facts.py, or the
experiment config that declares it), never typed again where it is used (issue 35)."""
import ast
from pathlib import Path

from conftest import ROOT
from experiments import facts

# module -> the numbers it must take from elsewhere, not type
USERS = {
    "experiments/training/measures/collapse.py": {facts.COLLAPSED_NATS},
    "experiments/report/sections/collapse.py": {facts.COLLAPSED_NATS},
    "experiments/training/measures/heads.py": {facts.MIXES, facts.EVEN_TOL},
    "experiments/report/sections/heads.py": {facts.MIXES, facts.EVEN_TOL},
}
# no_scaling's plateau level and ratio, as the phase section's text would type them (its config has them)
PHASE_TEXTS = ("0.9 ln V", "0.9 * ln_V", "5x")


def constants(path: Path) -> list:
    """Every number and every string literal in a module (docstrings aside)."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) not in docs]


def test_shared_numbers_are_not_typed_where_they_are_used():
    typed = {f: sorted(v for v in constants(ROOT / f) if isinstance(v, (int, float)) and not isinstance(v, bool)
                       and v in numbers) for f, numbers in USERS.items()}
    assert not any(typed.values()), typed
    texts = [v for f in USERS for v in constants(ROOT / f) if isinstance(v, str)]
    assert not [t for t in texts if "0.1 nats" in t], "a shared number typed into the report's text"
    phase = [v for v in constants(ROOT / "experiments/report/sections/phase.py") if isinstance(v, str)]
    assert not [t for t in phase if any(x in t for x in PHASE_TEXTS)]


def test_the_lock_file_and_the_corpus_size_are_named_once():
    assert ".lock" not in constants(ROOT / "experiments" / "io.py")  # experiments.layout.LOCK
    for f in ("README.md", "experiments/report/sections/text.py", "conf/data/python_source_char.yaml"):
        assert "32 modules" not in (ROOT / f).read_text(), f  # len(data.text.PY_MODULES)


def test_the_split_rule_and_the_phase_rule_come_from_their_one_place():
    assert facts.about_even(0.45, 0.5) and not facts.about_even(0.3, 0.6) and not facts.about_even(0.2, 0.25)
    from experiments.config import exp_check
    from experiments.report.sections import phase
    assert phase.FLATLINE == exp_check("no_scaling", "plateau") and phase.FLATLINE["value"] == 5
    assert "plateau >= 5x the scaled one (no_scaling's plateau check)" in phase.pairs_table([])[0]
