"""Releases installed side by side, each in a directory of its own: PINNED/tf-VERSION for transformers,
xt-VERSION for x-transformers, df-VERSION for diffusers (the zoos' `--pinned` layout), shared between sessions. A release is installed with pip's --no-deps
into PINNED/tf-VERSION.tmp and renamed into place when whole, so a directory that exists is complete;
the huggingface-hub, tokenizers, safetensors (and any other package transformers checks the version
of at import) that its own pins want and the system's do not satisfy go into the same directory. The other
libraries' releases go in alone (--no-deps): their dependencies are the environment's (requirements.txt)."""
import ast
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

# one cache of releases for the lab: PINNED_RELEASES, else ../pinned beside the clone
from doctor_lab.zoo.findings import PINNED as DEFAULT_PINNED

TRANSFORMERS = "transformers"
# library (its name on the package index) -> (its import name, its directory prefix, the oldest release listed)
LIBRARIES = {TRANSFORMERS: ("transformers", "tf", "4.30.0"),
             "x-transformers": ("x_transformers", "xt", "1.20.0"),
             "diffusers": ("diffusers", "df", "0.20.0")}
KNOWN = Path(__file__).with_name("transformers_releases.txt")  # the releases on the package index, 4.30 on


def known_file(library: str = TRANSFORMERS) -> Path:
    return KNOWN if library == TRANSFORMERS else KNOWN.with_name(f"{LIBRARIES[library][0]}_releases.txt")
WAIT_S = 600  # how long to wait for another process's install of the same release (PINNED/tf-X.tmp)


def known(library: str = TRANSFORMERS) -> tuple[str, ...]:
    """A library's releases on the package index from its oldest listed, oldest first (committed)."""
    return tuple(ln.strip() for ln in known_file(library).read_text().splitlines() if ln.strip() and not ln.startswith("#"))


def refresh_known(library: str = TRANSFORMERS) -> tuple[str, ...]:
    """Rewrite the library's list from `pip index versions LIBRARY` (the package index)."""
    r = subprocess.run([sys.executable, "-m", "pip", "index", "versions", library], capture_output=True, text=True)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("Available versions:")), None)
    if r.returncode or line is None:
        raise RuntimeError(f"pip index versions {library} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    oldest = LIBRARIES[library][2]
    vs = sorted((v.strip() for v in line.split(":", 1)[1].split(",") if Version(v.strip()) >= Version(oldest)), key=Version)
    known_file(library).write_text(
        f"# {library} releases on the package index from {oldest} (pip index versions {library}), oldest first;\n"
        "# python -m doctor_lab.backtest.releases --list rewrites it\n" + "\n".join(vs) + "\n")
    return tuple(vs)


def directory(pinned: Path, version: str, library: str = TRANSFORMERS) -> Path:
    return pinned / f"{LIBRARIES[library][1]}-{version}"


def installed(pinned: Path, version: str, library: str = TRANSFORMERS) -> bool:
    return (directory(pinned, version, library) / LIBRARIES[library][0] / "__init__.py").is_file()


def _literal(path: Path, name: str):
    """The value of the module-level assignment `name = <literal>` in a file, without importing it."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"{path} assigns no {name}")


def _pip(target: Path, *specs: str) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--disable-pip-version-check",
           "--target", str(target), *specs]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")


def _system_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def era_pins(package_dir: Path) -> list[str]:
    """The requirements (pip specs) a release checks at import that this interpreter's packages do not
    meet: read from its dependency_versions_check.py (which packages) and dependency_versions_table.py
    (which versions). tokenizers and accelerate are checked only when installed, as transformers does."""
    table = _literal(package_dir / "dependency_versions_table.py", "deps")
    checked = _literal(package_dir / "dependency_versions_check.py", "pkgs_to_check_at_runtime")
    wanted = []
    for name in checked:
        if name == "python" or name not in table:
            continue
        req = Requirement(table[name])
        have = _system_version(req.name)
        if have is None and name in ("tokenizers", "accelerate"):
            continue
        if have is None or not req.specifier.contains(Version(have), prereleases=True):
            wanted.append(str(req))
    return wanted


def install(version: str, pinned: Path = DEFAULT_PINNED, log=print, library: str = TRANSFORMERS) -> Path:
    """PINNED/tf-VERSION (xt-, df-), installed if it is not there yet (waits for another process's install)."""
    d = directory(pinned, version, library)
    tmp = d.with_name(d.name + ".tmp")
    deadline = time.monotonic() + WAIT_S
    while not installed(pinned, version, library) and tmp.exists() and time.monotonic() < deadline:
        time.sleep(5)  # someone else is installing it
    if installed(pinned, version, library):
        return d
    if tmp.exists():
        raise RuntimeError(f"{tmp} has stayed for {WAIT_S} s: a broken install? remove it and rerun")
    pinned.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        _pip(tmp, f"{library}=={version}")
        pins = era_pins(tmp / "transformers") if library == TRANSFORMERS else []
        if pins:
            _pip(tmp, *pins)
        tmp.rename(d)
    except BaseException:  # noqa: BLE001 -- any failure, interrupts too: the half-installed .tmp is removed, then re-raised
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"installed {library} {version} in {d} ({time.monotonic() - t0:.0f} s"
        + (f"; with {', '.join(pins)}" if pins else "") + ")")
    return d


def main(argv=None) -> int:
    """python -m doctor_lab.backtest.releases VERSION... [--pinned DIR] [--library L]: install releases;
    --list: rewrite the library's list of releases (transformers_releases.txt) from the package index."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m doctor_lab.backtest.releases", description=main.__doc__)
    p.add_argument("versions", nargs="*")
    p.add_argument("--pinned", type=Path, default=DEFAULT_PINNED)
    p.add_argument("--library", default=TRANSFORMERS, choices=sorted(LIBRARIES))
    p.add_argument("--list", action="store_true", help="rewrite the library's list of releases from the package index")
    a = p.parse_args(argv)
    try:
        if a.list:
            print(f"{len(refresh_known(a.library))} releases in {known_file(a.library)}")
    except RuntimeError as e:
        print(f"releases: {e}", file=sys.stderr)
        return 2
    unknown = [v for v in a.versions if v not in known(a.library)]
    if unknown:
        print(f"releases: not a {a.library} release on the index: {', '.join(unknown)} "
              f"(see {known_file(a.library).name})", file=sys.stderr)
        return 2
    for v in a.versions:
        try:
            print(install(v, a.pinned, library=a.library))
        except RuntimeError as e:
            print(f"releases: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
