"""The zoos' new findings, each upstream-ready in docs/findings/: NAME.md (the report), NAME.py (a
repro that imports its library and torch only: exit 1 while the bug is there, 0 once fixed) and
NAME.patch (the fix, a diff against the newest release in RELEASES: paths transformers/...,
x_transformers/... or diffusers/...; the first path names the library), with NAME@VERSION.patch
beside it for an older release whose source the newest patch does not fit. Every repro is checked on
every release of its library in RELEASES: the pinned one (the validation extra's pin in
requirements-validation.txt, what CI installs), the others from the shared cache of releases
(--pinned DIR, DIR/tf-X, xt-X, df-X).

    python -m doctor_lab.zoo.findings check                # every repro before and after its patch, each release
    python -m doctor_lab.zoo.findings check --zoo          # and the architecture's zoo rows, both ways
    python -m doctor_lab.zoo.findings copy NAME DIR        # DIR/<library>: the installed one, patched

A patched copy is a tree of links to the library in which the files the patch touches are real
copies, patched (seconds, a few MB); PYTHONPATH=DIR (or the zoo's --transformers DIR) imports it.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from attention_doctor.result import Row

ROOT = Path(__file__).resolve().parents[2]
FINDINGS = ROOT / "docs" / "findings"
REQUIREMENTS = ROOT / "requirements-validation.txt"
REPOS = {"transformers": "huggingface/transformers", "x_transformers": "lucidrains/x-transformers",
         "diffusers": "huggingface/diffusers"}
PIP = {"transformers": "transformers", "x_transformers": "x-transformers", "diffusers": "diffusers"}
SHORT = {"transformers": "tf", "x_transformers": "xt", "diffusers": "df"}   # the cache's DIR/tf-X layout
PINNED = Path(os.environ.get("PINNED_RELEASES") or ROOT.parent / "pinned")


def pins(path: Path = REQUIREMENTS) -> dict[str, str]:
    """{pip name: release} of a requirements file's `name==release` lines."""
    return {m[1].lower(): m[2] for m in re.finditer(r"^([A-Za-z0-9_.-]+)==([^\s;#]+)", Path(path).read_text(), re.M)}


# newer releases each library's repros are also checked on (the newest last: what NAME.patch is written against)
NEWER = {"transformers": ("5.25.0",), "x_transformers": (), "diffusers": ()}
# the releases each library's repros are checked on: the pinned one first (what CI installs), then NEWER
RELEASES = {package: (pins()[pip], *NEWER[package]) for package, pip in PIP.items()}


def names(package: str | None = None) -> list[str]:
    """The findings with a patch (each also has its .py repro and .md page), of one library's
    package (transformers, x_transformers, diffusers) or of all."""
    return sorted(p.stem for p in FINDINGS.glob("*.patch") if "@" not in p.stem and package in (None, library(p.stem)))


def passes_on(name: str) -> tuple[str, ...]:
    """The releases of RELEASES on which the finding's page says its repro passes unpatched (its
    `**Passes on**` line: a regression that came after them); the repro fails on every other one."""
    page = (FINDINGS / f"{name}.md").read_text()
    line = page[page.index("**Passes on**"):].splitlines()[0] if "**Passes on**" in page else ""
    return tuple(r for r in RELEASES[library(name)] if re.search(rf"(?<![\d.]){re.escape(r)}(?![\d.])", line))


def patch_file(name: str, release: str | None = None) -> Path:
    """NAME@RELEASE.patch where the release needs its own, else NAME.patch (the newest release's)."""
    own = FINDINGS / f"{name}@{release}.patch"
    return own if release and own.exists() else FINDINGS / f"{name}.patch"


def release_dir(package: str, release: str, pinned: Path | None = None) -> Path | None:
    """The directory that holds `package` at `release`: None for the installed one (already on the
    path), pinned/<tf|xt|df>-RELEASE from the cache; FileNotFoundError (with the pip command) when
    neither has it."""
    if version(package) == release:
        return None
    d = Path(pinned or PINNED) / f"{SHORT[package]}-{release}"
    if (d / package).is_dir():
        return d
    raise FileNotFoundError(f"{package} {release} is neither installed nor in {d}: "
                            f"pip install --no-deps --target {d} {PIP[package]}=={release}")


def library(name: str) -> str:
    """The package a finding's patch changes (the first path's first part)."""
    return touched(FINDINGS / f"{name}.patch")[0].split("/")[0]


def touched(patch: Path) -> list[str]:
    """The files a unified diff changes, relative to the copy's root (transformers/...)."""
    return [ln.split()[1].split("/", 1)[1] for ln in patch.read_text().splitlines() if ln.startswith("+++ ")]


def installed(package: str = "transformers") -> Path:
    """The installed package (its directory)."""
    try:
        if package == "x_transformers":
            import x_transformers as mod
        elif package == "diffusers":
            import diffusers as mod
        else:
            import transformers as mod
    except ImportError:
        raise RuntimeError(f"{package} is not installed (pip install -r requirements-validation.txt)") from None
    return Path(mod.__file__).parent


def version(package: str = "transformers", where: Path | None = None) -> str:
    """The package's release, from its dist-info beside it (x-transformers has no __version__): the
    installed one's, or the one in directory `where`; "unknown" when there is not exactly one."""
    found = [p.name[len(package) + 1:-len(".dist-info")]
             for p in (Path(where) if where else installed(package).parent).glob(f"{package}-*.dist-info")]
    return found[0] if len(found) == 1 else "unknown"


def copy(name: str, dest: Path, source: Path | None = None) -> Path:
    """dest/<package>: links to `source` (the package the patch changes: the installed one by
    default), the patch's files real and patched with the patch for source's release. Raises
    RuntimeError when the patch does not apply."""
    source = Path(source or installed(library(name))).resolve()
    dest = Path(dest)
    pkg = dest / library(name)
    if pkg.exists():
        shutil.rmtree(pkg)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, pkg, symlinks=True, copy_function=os.symlink,
                    ignore=shutil.ignore_patterns("__pycache__"))
    patch = patch_file(name, version(library(name), source.parent))
    for rel in touched(patch):
        f = dest / rel
        f.unlink()
        shutil.copyfile(source.parent / rel, f)
    p = subprocess.run(["git", "apply", "--unsafe-paths", "-p1", "--directory", str(dest.resolve()), str(patch.resolve())],
                       capture_output=True, text=True, cwd=dest)
    if p.returncode:
        raise RuntimeError(f"{patch.name} does not apply to {source}: {p.stderr.strip()[:300]}")
    return dest


def _repro_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore"}


def repros(names: list[str], copies: dict | None = None, timeout: int = 900,
           release: Path | None = None) -> dict[str, tuple[int, str]]:
    """{name: (exit code, output)} of several repros, one after another in ONE Python process (torch
    imported once: seconds per repro saved), each as `python NAME.py` runs it: its SystemExit its
    exit code, an uncaught exception exit 1 with its traceback. copies: {name: DIR}, its patched
    copy (copy()): that repro imports its library from DIR, every module of the library imported
    before it dropped first, so each repro sees its own patch alone; the others the installed one,
    or the one in directory `release` (release_dir())."""
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from doctor_lab.zoo.findings import _serve; _serve()"
    jobs = [(n, str((copies or {}).get(n) or release or "")) for n in names]
    p = subprocess.run([sys.executable, "-c", code], input=json.dumps(jobs), capture_output=True, text=True,
                       env=_repro_env(), timeout=timeout, cwd=tempfile.gettempdir())
    last = p.stdout.strip().splitlines()[-1:] or [""]
    if p.returncode or not last[0].startswith(_DONE):
        raise RuntimeError(f"the repros' process ended with exit {p.returncode}: {(p.stdout + p.stderr)[-800:]}")
    return {n: tuple(v) for n, v in json.loads(last[0][len(_DONE):]).items()}


_DONE = "repros done: "


def _serve():
    """In repros' process: each (name, directory or "") on stdin, its repro as __main__ with its
    library imported afresh (from the directory: a patched copy or a release, else the installed
    one), its output captured."""
    import io
    import runpy
    import traceback
    from contextlib import redirect_stderr, redirect_stdout
    out, stdout, path = {}, sys.stdout, list(sys.path)
    for name, copy_dir in json.load(sys.stdin):
        package = library(name)
        for m in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
            del sys.modules[m]  # the library as this repro's own process would import it
        sys.path[:] = ([copy_dir] if copy_dir else []) + path  # a new entry: a fresh finder reads it
        buf, code = io.StringIO(), 0
        sys.argv = [str(FINDINGS / f"{name}.py")]
        with redirect_stdout(buf), redirect_stderr(buf):
            try:
                runpy.run_path(sys.argv[0], run_name="__main__")
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:  # noqa: BLE001 - as Python ends on an uncaught exception
                code = 1
                traceback.print_exc()
        imported = sys.modules.get(package)
        if copy_dir and imported is not None and not imported.__file__.startswith(copy_dir):
            code, buf = 70, io.StringIO(f"{name}: {package} came from {imported.__file__}, not from {copy_dir}")
        out[name] = (code, buf.getvalue().strip())
    print(_DONE + json.dumps(out), file=stdout, flush=True)


def archs(name: str) -> list[str]:
    """The architectures of the finding's rows in the transformers zoo's triage (doctor_lab/zoo/triage.yaml)."""
    from doctor_lab.report.triage import load
    if library(name) != "transformers":
        return []
    return sorted({a for e in load() if Path(e.get("finding", "")).stem == name
                   for r in e["rules"] for a in r.get("archs", [])})


def zoo_rows(arch_list: list[str], out: Path, transformers: Path | None = None) -> dict:
    """{(arch, impl, check): verdict} of a zoo run on `arch_list` (into `out`)."""
    cmd = [sys.executable, "-m", "doctor_lab.zoo", "--arch", *arch_list, "--out", str(out), "--no-confirm"]
    if transformers:
        cmd += ["--transformers", str(transformers)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    if p.returncode:
        raise RuntimeError(p.stderr.strip()[-500:])
    z = json.loads((Path(out) / "zoo.json").read_text())
    return {(r["arch"], r["impl"], c["name"]): Row.from_dict(c).outcome.value
            for r in z["results"] if r["status"] == "examined" for c in r["checks"]}


def check(which: list[str], zoo: bool = False, pinned: Path | None = None, show: bool = False) -> int:
    """Every repro fails on each release of its library in RELEASES and passes on that release
    patched (one process per library and release, before and after), but on a release its page says
    it passes on (a regression that came later: it must pass there unpatched); a release neither installed
    nor cached is named with its install command and not counted as checked. With zoo, the finding's
    architectures' rows before and after on the installed release (only its own rows may change).
    show: each repro's output too, before and after (the numbers its page reports)."""
    bad, unchecked = 0, []
    with tempfile.TemporaryDirectory(prefix="findings-") as tmp:
        for package in dict.fromkeys(map(library, which)):
            group = [n for n in which if library(n) == package]
            for rel in RELEASES[package]:
                try:
                    where = release_dir(package, rel, pinned)
                except FileNotFoundError as e:
                    unchecked.append(f"{package} {rel}")
                    print(f"{package} {rel}: NOT CHECKED: {e}", flush=True)
                    continue
                source = (where / package) if where else installed(package)
                failing = [n for n in group if rel not in passes_on(n)]
                copies = {n: copy(n, Path(tmp) / rel / n, source) for n in failing}
                before, after = repros(group, release=where), repros(failing, copies) if failing else {}
                for name in group:
                    if name not in failing:   # a release before the regression: the repro holds unpatched
                        ok = before[name][0] == 0
                        print(f"{name} ({package} {rel}, before the regression): exit {before[name][0]} (0 expected)"
                              + ("" if ok else f"  <-- NOT AS EXPECTED\n{before[name][1][-800:]}"), flush=True)
                    else:
                        ok = before[name][0] == 1 and after[name][0] == 0
                        print(f"{name} ({package} {rel}): before its patch exit {before[name][0]} (1 expected), after "
                              f"exit {after[name][0]} (0 expected)"
                              + ("" if ok else f"  <-- NOT AS EXPECTED\n{after[name][1][-800:]}"), flush=True)
                    bad += not ok
                    if show:
                        for when, res in (("before", before), ("after", after)):
                            if name in res:
                                print(f"  {when}:\n    " + "\n    ".join(res[name][1].splitlines()), flush=True)
        for name in which:
            if zoo and archs(name):
                d = copy(name, Path(tmp) / name)
                a, b = zoo_rows(archs(name), Path(tmp) / f"{name}-zoo-before"), zoo_rows(
                    archs(name), Path(tmp) / f"{name}-zoo-after", d)
                changed = {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
                print(f"  zoo rows of {', '.join(archs(name))}: {len(a)} before, {len(b)} after; changed: "
                      + (", ".join(f"{'/'.join(k)} {x} -> {y}" for k, (x, y) in changed.items()) or "none"), flush=True)
    print(f"{bad} not as expected" + (f"; not checked on {', '.join(unchecked)} (above: how to install it)" if unchecked else ""))
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m doctor_lab.zoo.findings", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="each repro before and after its patch")
    c.add_argument("names", nargs="*", help=f"default: all ({', '.join(names())})")
    c.add_argument("--zoo", action="store_true", help="also the zoo rows of the finding's architectures, both ways")
    c.add_argument("--show", action="store_true", help="print each repro's output, before and after")
    c.add_argument("--pinned", type=Path, metavar="DIR", help=f"the cache of releases (DIR/tf-X, xt-X, df-X; default {PINNED})")
    k = sub.add_parser("copy", help="DIR/<library>: the installed library with NAME's patch")
    k.add_argument("name")
    k.add_argument("dir", type=Path)
    a = ap.parse_args(argv)
    unknown = [n for n in ([a.name] if a.cmd == "copy" else a.names) if n not in names()]
    if unknown:
        print(f"findings: no docs/findings/{unknown[0]}.patch (known: {', '.join(names())})", file=sys.stderr)
        return 2
    try:
        if a.cmd == "copy":
            print(copy(a.name, a.dir))
            return 0
        return check(a.names or names(), a.zoo, a.pinned, a.show)
    except RuntimeError as e:
        print(f"findings: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
