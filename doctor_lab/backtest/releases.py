"""Transformers releases installed side by side, each in a directory of its own: PINNED/tf-VERSION
(the zoo's `--pinned` layout), shared between sessions. A release is installed with pip's --no-deps
into PINNED/tf-VERSION.tmp and renamed into place when whole, so a directory that exists is complete;
the huggingface-hub, tokenizers, safetensors (and any other package transformers checks the version
of at import) that its own pins want and the system's do not satisfy go into the same directory."""
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

KNOWN = Path(__file__).with_name("transformers_releases.txt")  # the releases on the package index, 4.36 on
OLDEST = Version("4.36.0")
WAIT_S = 600  # how long to wait for another process's install of the same release (PINNED/tf-X.tmp)


def known() -> tuple[str, ...]:
    """The transformers releases on the package index from 4.36, oldest first (KNOWN, committed)."""
    return tuple(ln.strip() for ln in KNOWN.read_text().splitlines() if ln.strip() and not ln.startswith("#"))


def refresh_known() -> tuple[str, ...]:
    """Rewrite KNOWN from `pip index versions transformers` (the package index)."""
    r = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "transformers"], capture_output=True, text=True)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("Available versions:")), None)
    if r.returncode or line is None:
        raise RuntimeError(f"pip index versions transformers failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    vs = sorted((v.strip() for v in line.split(":", 1)[1].split(",") if Version(v.strip()) >= OLDEST), key=Version)
    KNOWN.write_text("# transformers releases on the package index from 4.36 (pip index versions transformers), "
                     "oldest first;\n# python -m doctor_lab.backtest.releases --list rewrites it\n" + "\n".join(vs) + "\n")
    return tuple(vs)


def directory(pinned: Path, version: str) -> Path:
    return pinned / f"tf-{version}"


def installed(pinned: Path, version: str) -> bool:
    return (directory(pinned, version) / "transformers" / "__init__.py").is_file()


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


def install(version: str, pinned: Path = DEFAULT_PINNED, log=print) -> Path:
    """PINNED/tf-VERSION, installed if it is not there yet (waits for another process's install)."""
    d = directory(pinned, version)
    tmp = d.with_name(d.name + ".tmp")
    deadline = time.monotonic() + WAIT_S
    while not installed(pinned, version) and tmp.exists() and time.monotonic() < deadline:
        time.sleep(5)  # someone else is installing it
    if installed(pinned, version):
        return d
    if tmp.exists():
        raise RuntimeError(f"{tmp} has stayed for {WAIT_S} s: a broken install? remove it and rerun")
    pinned.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        _pip(tmp, f"transformers=={version}")
        pins = era_pins(tmp / "transformers")
        if pins:
            _pip(tmp, *pins)
        tmp.rename(d)
    except BaseException:  # noqa: BLE001 -- any failure, interrupts too: the half-installed .tmp is removed, then re-raised
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"installed transformers {version} in {d} ({time.monotonic() - t0:.0f} s"
        + (f"; with {', '.join(pins)}" if pins else "") + ")")
    return d


def main(argv=None) -> int:
    """python -m doctor_lab.backtest.releases VERSION... [--pinned DIR]: install releases;
    --list: rewrite transformers_releases.txt from the package index."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m doctor_lab.backtest.releases", description=main.__doc__)
    p.add_argument("versions", nargs="*")
    p.add_argument("--pinned", type=Path, default=DEFAULT_PINNED)
    p.add_argument("--list", action="store_true", help=f"rewrite {KNOWN.name} from the package index")
    a = p.parse_args(argv)
    try:
        if a.list:
            print(f"{len(refresh_known())} releases in {KNOWN}")
    except RuntimeError as e:
        print(f"releases: {e}", file=sys.stderr)
        return 2
    unknown = [v for v in a.versions if v not in known()]
    if unknown:
        print(f"releases: not a transformers release on the index: {', '.join(unknown)} (see {KNOWN.name})",
              file=sys.stderr)
        return 2
    for v in a.versions:
        try:
            print(install(v, a.pinned))
        except RuntimeError as e:
            print(f"releases: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
