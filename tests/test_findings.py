"""The zoos' new findings (docs/findings/): each page has the parts a maintainer needs, and each
repro fails on every release of its library the page names (the bug is there) and passes on that
release patched (the fix works): the pinned release (installed: requirements-validation.txt, one
place), and a newer one where the shared cache of releases holds it (findings.PINNED; else a skip
naming the install command). The patched copy is a tree of links to the library with the patched
files copied (doctor_lab/zoo/findings.py), built here in a temporary directory."""
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
        fails_on = page[page.index("**Fails on**"):].splitlines()[0] if "**Fails on**" in page else ""
        failing = [r for r in findings.RELEASES[package] if r not in findings.passes_on(name)]
        assert findings.RELEASES[package][-1] in failing, (name, "the patch is the newest release's: it fails there")
        assert all(r in fails_on for r in failing), (name, "the page names the releases its repro fails on", fails_on)
        repro = (findings.FINDINGS / f"{name}.py").read_text()
        imports = {m.split(".")[0] for m in re.findall(r"^(?:from|import) (\S+)", repro, re.M)}
        assert imports <= {"sys", "torch", package}, (name, imports)  # standalone: no doctor, no project
        assert findings.touched(findings.FINDINGS / f"{name}.patch"), name


def need(package: str, release: str):
    """The directory holding `package` at `release` (None: the installed one), else a skip saying how
    to get it. The pinned release must be the installed one: another release is an environment the
    validation extra did not install (a failure, not a skip)."""
    pytest.importorskip(package, reason="the validation extra: pip install -r requirements-validation.txt")
    if release == findings.RELEASES[package][0]:
        assert findings.version(package) == release, (
            f"{package} {findings.version(package)} is installed; requirements-validation.txt pins "
            f"{release}: pip install -r requirements-validation.txt")
    try:
        return findings.release_dir(package, release)
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_the_pins_are_the_validation_extras(tmp_path):
    """The releases the patches are written against are read from requirements-validation.txt, one
    place: a `name==release` line per library, comments and other lines ignored."""
    req = tmp_path / "r.txt"
    req.write_text("# x-transformers==0.0.1 in a comment\nTransformers==5.0.0  # pinned\ntorch>=2\n"
                   "x-transformers==2.3.27\ndiffusers==0.30.0 ; python_version >= '3.10'\n")
    assert findings.pins(req) == {"transformers": "5.0.0", "x-transformers": "2.3.27", "diffusers": "0.30.0"}
    pinned = findings.pins()
    assert {p: r[0] for p, r in findings.RELEASES.items()} == {p: pinned[pip] for p, pip in findings.PIP.items()}


@pytest.fixture(scope="module")
def installed():
    pinned = findings.RELEASES["transformers"][0]
    if need("transformers", pinned) is not None:
        pytest.skip(f"the installed transformers is {findings.version('transformers')}, not the pinned {pinned}")
    return findings.installed("transformers")


@pytest.mark.parametrize("package, release", [(p, r) for p, rs in findings.RELEASES.items() for r in rs])
def test_a_repro_fails_before_its_patch_and_passes_after(package, release, tmp_path):
    """The shrunk case: the first finding of each library (all of them, minutes: `python -m
    doctor_lab.zoo.findings check`, which runs this same comparison)."""
    where = need(package, release)
    names = [n for n in findings.names(package) if release not in findings.passes_on(n)][:1]
    source = where / package if where else findings.installed(package)
    copies = {n: findings.copy(n, tmp_path / n, source) for n in names}
    # before: every repro on the release; after: each on its own patched copy (the library imported
    # afresh from it); each in one process, side by side
    with ThreadPoolExecutor(2) as pool:
        before, after = pool.map(lambda c: findings.repros(names, c, release=None if c else where), [None, copies])
    for n in names:
        assert before[n][0] == 1 and "BUG" in before[n][1], (n, release, before[n][1][-1500:])
        assert after[n][0] == 0 and "OK" in after[n][1], (n, release, after[n][1][-1500:])


def test_a_patched_copy_is_the_installed_one_plus_the_patch(installed, tmp_path):
    name = "xlm_causal_ignores_padding_mask"
    d = findings.copy(name, tmp_path)
    (rel,) = findings.touched(findings.FINDINGS / f"{name}.patch")
    assert not (d / rel).is_symlink() and "mask[:, None, :].bool()" in (d / rel).read_text()
    assert (d / "transformers" / "__init__.py").is_symlink()   # everything else: links
    assert "mask[:, None, :].bool()" not in (installed.parent / rel).read_text()  # the installed one untouched


def test_a_page_names_the_releases_before_its_regression(tmp_path, monkeypatch):
    """A regression's page says where its repro passes unpatched (`**Passes on**`): those releases of
    RELEASES, named as releases (5.23.0 is not 5.23.01), no other."""
    monkeypatch.setattr(findings, "FINDINGS", tmp_path)
    (tmp_path / "a.patch").write_text("--- a/transformers/x.py\n+++ b/transformers/x.py\n")
    older, newest = findings.RELEASES["transformers"][0], findings.RELEASES["transformers"][-1]
    (tmp_path / "a.md").write_text(f"**Fails on**: transformers {newest}\n**Passes on**: transformers {older} (before)\n")
    assert findings.passes_on("a") == (older,) != (newest,)
    (tmp_path / "a.md").write_text(f"**Fails on**: transformers {newest}\n**Passes on**: transformers {older}1\n")
    assert findings.passes_on("a") == ()
    (tmp_path / "a.md").write_text(f"**Fails on**: transformers {older} and {newest}\n")
    assert findings.passes_on("a") == ()


def test_a_regression_passes_unpatched_on_the_pinned_release_before_it(installed):
    pinned = findings.RELEASES["transformers"][0]
    names = [n for n in findings.names("transformers") if pinned in findings.passes_on(n)]
    assert names, "a regression newer than the pinned release (xlm_generate_passes_its_cache)"
    got = findings.repros(names)
    for n in names:
        assert got[n][0] == 0 and "OK" in got[n][1], (n, got[n][1][-1500:])
