"""The zoos' new findings (docs/findings/): each page has the parts a maintainer needs, and each
repro fails on the installed library (the bug is there) and passes on a copy patched with its
.patch (the fix works). The patched copy is a tree of links to the installed library with the
patched files copied (experiments/zoo/findings.py), built here in a temporary directory."""
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from experiments.zoo import findings

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
    """The installed package, at the release its patches are written against (else a skip saying so)."""
    pytest.importorskip(package, reason="the validation extra: pip install -r requirements-validation.txt")
    if findings.version(package) != findings.RELEASES[package]:
        pytest.skip(f"the patches are written against {package} {findings.RELEASES[package]}, not {findings.version(package)}")
    return findings.installed(package)


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
