"""Every import points downwards: the library at the bottom, the run's entry point at the top, no
circle. The imports are read from the source (ast: top-level and inside functions alike), so what
a grep or an import graph sees is what the test holds."""
import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Lowest first. A module may import modules of a lower layer and of its own unit (the prefix it
# matched); a module no prefix matches, and every `__main__` (a command), sits at the top, beside run.py.
LAYERS = [
    ("attention", "data"),                                           # the library: torch, no experiments
    ("experiments.layout", "experiments.facts", "experiments.suggest"),  # names, and numbers training and report share
    ("experiments.io", "experiments.on_text", "experiments.job_log"),  # files (the lock's name is layout's)
    ("experiments.judging", "experiments.schema"),                   # rules: what a config may be, how a run is judged
    ("experiments.records", "experiments.config", "experiments.command_line"),
    ("experiments.training", "experiments.report",                   # training never draws; the report never trains
     "attention_doctor"),  # the library's client: `self:` composes this project's config (experiments.config)
    ("experiments.bench", "experiments.callbacks"),
    ("experiments.reference",),
    # the doctor's lab, above the suite and the doctor: nothing below imports it
    ("doctor_lab.generated",),  # the generated bed: the lab's report section reads its records and triage
    ("doctor_lab.report", "doctor_lab.references", "doctor_lab.styles"),  # triage and the lab's report; the test beds
    ("doctor_lab.hand_caches",),  # the hand-written caches' bed: the styles bed's factories
    ("doctor_lab.zoo", "doctor_lab.zoo_xt", "doctor_lab.zoo_diffusers"),  # the zoos triage with the report's rules
    ("doctor_lab.validation",    # the evidence: the test beds, nanoGPT's attention (bench), its report block
     "doctor_lab.backtest",      # the regressions transformers shipped, their repros, the releases they need
     "doctor_lab.public"),       # issue 61's public classes, each pointed at in its checkout
]
TOP = len(LAYERS)
# what the lab takes from the suite (anything else of experiments/ it would need moves down or into the lab)
LAB_USES = {"experiments.io",                     # atomic writes of its tables and JSON
            "experiments.report.markdown",        # README blocks, nested under the page's headings
            "experiments.report.figures",         # the report's figure style, for the zoos' pictures
            "experiments.bench.nanogpt_reference"}  # nanoGPT's attention as transcribed: a specificity target


@functools.cache
def modules() -> dict[str, Path]:
    out = {"run": ROOT / "run.py"}
    for top in ("attention", "attention_doctor", "data", "experiments", "doctor_lab"):
        for p in sorted((ROOT / top).rglob("*.py")):
            parts = p.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


@functools.cache
def files_of_tests() -> dict[str, Path]:
    """tests/*.py by the names they import each other with (tests/ is on sys.path under pytest)."""
    return {p.stem: p for p in sorted((ROOT / "tests").glob("*.py"))}


@functools.cache
def graph() -> dict[str, set[str]]:
    return imports(modules())


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """{module: the project's modules it imports}; `from pkg import name` counts pkg.name when
    that is a module, else pkg."""
    graph = {}
    for m, p in mods.items():
        found = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                         for a in node.names]
            else:
                continue
            found |= {n for n in names if n in mods and n != m}
        graph[m] = found
    return graph


def unit(module: str) -> tuple[int, str]:
    """(layer, unit prefix) of a module."""
    if module.endswith(".__main__"):
        return TOP, module
    matches = [(len(prefix), layer, prefix) for layer, prefixes in enumerate(LAYERS) for prefix in prefixes
               if module == prefix or module.startswith(prefix + ".")]
    return max(matches)[1:] if matches else (TOP, module)  # the longest prefix: doctor_lab.zoo over experiments


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(u):
        state[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if v not in state and (c := visit(v)):
                return c
        state[u] = 2
        stack.pop()
        return None
    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_no_import_circle():
    c = circle(graph())
    assert c is None, "circle: " + " -> ".join(c)
    c = circle(imports({**modules(), **files_of_tests()}))   # the tests among themselves and with the project
    assert c is None, "circle: " + " -> ".join(c)


def test_no_circle_between_units():
    """Nor between units (a prefix of LAYERS, or a module of its own): judging and the report, the zoos
    and the lab's report, each pair imports one way."""
    units: dict[str, set[str]] = {}
    for m, targets in graph().items():
        own = unit(m)[1]
        units.setdefault(own, set()).update(unit(t)[1] for t in targets if unit(t)[1] != own)
    for targets in list(units.values()):
        for t in targets:
            units.setdefault(t, set())
    c = circle(units)
    assert c is None, "circle: " + " -> ".join(c)


def test_every_import_points_downwards():
    climbs = []
    for m, targets in graph().items():
        (layer, own) = unit(m)
        for t in sorted(targets):
            t_layer, t_unit = unit(t)
            if not (t_layer < layer or t_unit == own):
                climbs.append(f"{m} (layer {layer}) imports {t} (layer {t_layer})")
    assert not climbs, "\n".join(climbs)


def test_the_walk_sees_imports_inside_functions():
    assert "experiments.schema" in graph()["experiments.config"]  # a module-level import
    src = ROOT / "experiments" / "schema.py"
    assert any(isinstance(n, ast.ImportFrom) and n.module == "data" for n in ast.walk(ast.parse(src.read_text())))
    assert "data" in graph()["experiments.schema"]  # `from data import TASKS` inside a function


def test_code_named_from_config_is_listed_where_a_grep_finds_it():
    """Report sections and measures are explicit tables (report.build.SECTIONS, measures.MEASURES):
    every section module is in SECTIONS once, every MEASURES entry is a function of measures/."""
    from experiments.report.build import SECTIONS
    from experiments.training.measures import MEASURES
    files = sorted(p.stem for p in (ROOT / "experiments" / "report" / "sections").glob("*.py") if p.stem != "__init__")
    assert sorted(m.__name__.rsplit(".", 1)[1] for m in SECTIONS) == files
    assert all(f.__module__.startswith("experiments.training.measures.") for f in MEASURES.values())
    for p in [*ROOT.joinpath("experiments").rglob("*.py"), *ROOT.joinpath("doctor_lab").rglob("*.py")]:
        if p.name == "validation.py":
            continue  # imports other libraries' pinned releases (transformers, torchtune) by name, none of ours
        src = p.read_text()
        assert "import_module" not in src and "pkgutil" not in src, f"{p}: code named by a string"


def test_the_library_imports_neither_experiments_nor_the_doctor():
    """attention/ is the bottom: no import of experiments/ or attention_doctor, with no exception."""
    up = [f"{m} imports {t}" for m, targets in graph().items() if m == "attention" or m.startswith("attention.")
          for t in targets if t.split(".")[0] in ("experiments", "attention_doctor")]
    assert not up, up


def test_the_doctor_imports_experiments_for_self_only():
    """attention_doctor reaches experiments/ in one place: project.py's `self:` (conf/ composed)."""
    users = {m for m, targets in graph().items() if m.startswith("attention_doctor")
             for t in targets if t.split(".")[0] == "experiments"}
    assert users == {"attention_doctor.project"}, users


def test_nothing_imports_the_lab():
    """doctor_lab/ is at the top: the suite, the library and the doctor never import it."""
    up = [f"{m} imports {t}" for m, targets in graph().items() if not m.startswith("doctor_lab")
          for t in targets if t.startswith("doctor_lab")]
    assert not up, up


def test_the_lab_takes_from_the_suite_only_what_it_lists():
    uses = {t for m, targets in graph().items() if m.startswith("doctor_lab") for t in targets
            if t.split(".")[0] in ("experiments", "data", "run")}
    assert uses <= LAB_USES, sorted(uses - LAB_USES)


def test_nothing_outside_tests_imports_tests():
    """No module of the project imports a module of tests/, by name or by putting tests/ on sys.path."""
    names = set(files_of_tests()) | {"tests"}
    bad = []
    for m, p in modules().items():
        src = p.read_text()
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Import):
                bad += [f"{m} imports {a.name}" for a in node.names if a.name.split(".")[0] in names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                bad += [f"{m} imports {node.module}"] if node.module.split(".")[0] in names else []
        if re.search(r"sys\.path\.(insert|append)\([^)]*tests", src):
            bad.append(f"{m} puts tests/ on sys.path")
    assert not bad, bad


def test_the_walk_sees_the_lab_and_the_tests():
    assert "doctor_lab.report.triage" in graph()["doctor_lab.zoo.table"]
    assert "doctor_lab.styles.classic" in graph()["doctor_lab.validation"]   # imported inside a function
    assert "test_report" in imports({**modules(), **files_of_tests()})["test_pages"]
