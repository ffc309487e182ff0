"""docs/doctor.md's worked example of the doctor in a maintainer's CI, rendered from real runs:
the example project (docs/examples/ci_project: a small package, its test file, a baseline with one
expected behaviour) copied to a scratch directory, `pytest -v` run in it with the plugin (the clone's
attention_doctor, loaded as its entry point loads it) on the code as it is and on a regression (a
commit that lets each token see the next one), and `attention-doctor --against` on the two results.
Writes the files and the outputs between docs/doctor.md's <!-- BEGIN ci_example:NAME --> markers.

    python -m doctor_lab.ci_example            # docs/doctor.md
    python -m doctor_lab.ci_example --check    # exit 1 if the page's blocks are not the files' (outputs not rerun)
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "docs" / "examples" / "ci_project"
DOC = ROOT / "docs" / "doctor.md"
FILES = {"model": "tiny_lm/model.py", "test": "tests/test_attention.py", "baseline": "tests/attention_baseline.json"}
REGRESSION = ('def build(bug=None', 'def build(bug="sees_next"')   # the commit the second run tests
BLOCK = re.compile(r"(<!-- BEGIN ci_example:(\w+) -->\n).*?(<!-- END ci_example:\2 -->)", re.S)


def _fenced(text: str, lang: str) -> str:
    return f"```{lang}\n{text.rstrip()}\n```\n"


def files() -> dict[str, str]:
    """The example's files as the page shows them."""
    lang = {"model": "python", "test": "python", "baseline": "json"}
    return {name: _fenced((PROJECT / path).read_text(), lang[name]) for name, path in FILES.items()}


def _run(cmd: list[str], cwd: Path, shown: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(cwd)]), "COLUMNS": "100",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    out = (p.stdout + p.stderr).replace(str(cwd) + os.sep, "").replace(str(cwd), ".")
    out = re.sub(r" in \d+\.\d+s", " in N.NNs", out)   # the one thing that differs run to run
    return f"$ {shown}\n{out.rstrip()}\n$ echo $?\n{p.returncode}\n"


def outputs() -> dict[str, str]:
    """The clean run, the regression's run and the change between their results, as CI prints them."""
    blocks = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "ci_project"
        shutil.copytree(PROJECT, work, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
        pytest = [sys.executable, "-m", "pytest", "-p", "attention_doctor.pytest_plugin", "-p", "no:cacheprovider",
                  "-p", "no:xdist", "-v", "--no-header"]
        blocks["clean"] = _run(pytest + ["--attention-doctor-json", "clean"], work,
                               "pytest -v --attention-doctor-json clean")
        model = work / FILES["model"]
        text = model.read_text()
        assert REGRESSION[0] in text, f"{FILES['model']} no longer has {REGRESSION[0]!r}"
        model.write_text(text.replace(*REGRESSION))
        blocks["regression"] = _run(pytest + ["--attention-doctor-json", "regression"], work,
                                    "pytest -v --attention-doctor-json regression")
        json_name = "tests_test_attention.py_test_model.json"
        blocks["against"] = _run([sys.executable, "-m", "attention_doctor", "--against", f"clean/{json_name}",
                                  f"regression/{json_name}"], work,
                                 f"attention-doctor --against clean/{json_name} regression/{json_name}")
    return {k: _fenced(v, "text") for k, v in blocks.items()}


def write(doc: Path, blocks: dict[str, str]) -> list[str]:
    """Each block between its markers in `doc`; returns the markers with no block (left as they were)."""
    text = doc.read_text()
    missing = []

    def fill(m):
        if m.group(2) not in blocks:
            missing.append(m.group(2))
            return m.group(0)
        return m.group(1) + blocks[m.group(2)] + m.group(3)
    new = BLOCK.sub(fill, text)
    if new != text:
        doc.write_text(new)
    return missing


def stale(doc: Path) -> list[str]:
    """The file blocks of `doc` that are not the example's files."""
    have = {m.group(2): m.group(0) for m in BLOCK.finditer(doc.read_text())}
    return [k for k, v in files().items() if k not in have or v not in have[k]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m doctor_lab.ci_example", description=__doc__.split("\n\n")[0])
    ap.add_argument("--doc", type=Path, default=DOC)
    ap.add_argument("--check", action="store_true", help="only check that the page shows the example's files")
    a = ap.parse_args(argv)
    if a.check:
        bad = stale(a.doc)
        if bad:
            print(f"ci_example: {a.doc}'s blocks {', '.join(bad)} are not the example's files: "
                  "python -m doctor_lab.ci_example", file=sys.stderr)
        return 1 if bad else 0
    missing = write(a.doc, {**files(), **outputs()})
    if missing:
        print(f"ci_example: {a.doc} has markers with no block: {', '.join(missing)}", file=sys.stderr)
        return 1
    print(f"ci_example: {a.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
