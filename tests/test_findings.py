"""The zoos' new findings (docs/findings/): each page has the parts a maintainer needs, and each
repro fails on the installed library (the bug is there) and passes on a copy patched with its
.patch (the fix works). The patched copy is a tree of links to the installed library with the
patched files copied (doctor_lab/zoo/findings.py), built here in a temporary directory."""
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from doctor_lab.zoo import findings

pytestmark = pytest.mark.validation
PARTS = ["## Repro", "## Cause", "## Patch", "## Public threads", "## Report"]


def test_every_finding_is_upstream_ready():
    names = findings.names()
    assert len(names) >= 24 and {findings.library(n) for n in names} == set(findings.RELEASES)
    for name in names:
        package = findings.library(name)
        page = (findings.FINDINGS / f"{name}.md").read_text()
        assert all(part in page for part in PARTS), (name, [p for p in PARTS if p not in page])
        assert re.search(r"line[s]? \d+", page), f"{name}: the cause names no line of the library's source"
        assert re.search(rf"Searched ({findings.REPOS[package]}|for )", page), f"{name}: no search of public threads"
        report = page[page.index("## Report"):]
        assert all(k in report for k in ("**Environment**", "**Reproduction**", "**Expected**", "**Actual**",
                                          "**Proposed fix**")), name
        repro = (findings.FINDINGS / f"{name}.py").read_text()
        imports = {m.split(".")[0] for m in re.findall(r"^(?:from|import) (\S+)", repro, re.M)}
        assert imports <= {"sys", "torch", package}, (name, imports)  # standalone: no doctor, no project
        assert findings.touched(findings.FINDINGS / f"{name}.patch"), name


def need(package: str):
    """The installed package, which must be the release requirements-validation.txt pins (the one its
    patches are written against): another release is an environment the extra did not install."""
    pytest.importorskip(package, reason="the validation extra: pip install -r requirements-validation.txt")
    assert findings.version(package) == findings.RELEASES[package], (
        f"{package} {findings.version(package)} is installed; requirements-validation.txt pins "
        f"{findings.RELEASES[package]}: pip install -r requirements-validation.txt")
    return findings.installed(package)


def test_the_pins_are_the_validation_extras(tmp_path):
    """The releases the patches are written against are read from requirements-validation.txt, one
    place: a `name==release` line per library, comments and other lines ignored."""
    req = tmp_path / "r.txt"
    req.write_text("# x-transformers==0.0.1 in a comment\nTransformers==5.0.0  # pinned\ntorch>=2\n"
                   "x-transformers==2.3.27\ndiffusers==0.30.0 ; python_version >= '3.10'\n")
    assert findings.pins(req) == {"transformers": "5.0.0", "x-transformers": "2.3.27", "diffusers": "0.30.0"}
    pinned = findings.pins()
    assert findings.RELEASES == {p: pinned[pip] for p, pip in findings.PIP_NAMES.items()}


@pytest.fixture(scope="module")
def installed():
    return need("transformers")


@pytest.mark.parametrize("package", list(findings.RELEASES))
def test_each_repro_fails_before_its_patch_and_passes_after(package, tmp_path):
    need(package)
    names = findings.names(package)
    copies = {n: findings.copy(n, tmp_path / n) for n in names}
    # before: every repro on the installed library; after: each on its own patched copy (the library
    # imported afresh from it); each in one process, side by side
    with ThreadPoolExecutor(2) as pool:
        before, after = pool.map(lambda c: findings.repros(names, c), [None, copies])
    for n in names:
        assert before[n][0] == 1 and "BUG" in before[n][1], (n, before[n][1][-1500:])
        assert after[n][0] == 0 and "OK" in after[n][1], (n, after[n][1][-1500:])


def test_a_patched_copy_is_the_installed_one_plus_the_patch(installed, tmp_path):
    name = "xlm_causal_ignores_padding_mask"
    d = findings.copy(name, tmp_path)
    (rel,) = findings.touched(findings.FINDINGS / f"{name}.patch")
    assert not (d / rel).is_symlink() and "mask[:, None, :].bool()" in (d / rel).read_text()
    assert (d / "transformers" / "__init__.py").is_symlink()   # everything else: links
    assert "mask[:, None, :].bool()" not in (installed.parent / rel).read_text()  # the installed one untouched
