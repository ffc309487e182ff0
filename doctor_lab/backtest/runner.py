"""The doctor on one release: the release installed in isolation (releases.install, cached), then
the library's zoo as a subprocess, once per architecture (`python -m doctor_lab.zoo --release V
--arch A --checks ...`; another library's zoo, `python -m doctor_lab.zoo_xt --target A --path ...`, with
the release's directory first on PYTHONPATH): the zoo caps and forks each architecture itself, keeps
the results that exist (a killed backtest resumes), and refuses an architecture the release does not
map, which then costs only that architecture. What each call said is kept beside its results (attempts/), and
a failed install in install.json: the table's `not run` reasons, readable without rerunning."""
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from doctor_lab.backtest import releases
from experiments.io import write_json

ROOT = Path(__file__).resolve().parents[2]   # the clone: `python -m doctor_lab.zoo` runs from here
ZOO_TIMEOUT_S = 600   # the zoo's own cap per architecture (its --timeout); its CPU cap is its --cpu
SLACK_S = 300         # the zoo's imports and table around that


def install_error_path(root: Path, release: str) -> Path:
    return Path(root) / release / "install.json"


def attempt_path(out: Path, arch: str) -> Path:
    return Path(out) / "attempts" / f"{arch}.json"


def install(release: str, pinned: Path, root: Path, log=print, library: str = releases.TRANSFORMERS) -> bool:
    """The release installed (True), or why not written to install.json (False) in the release's
    directory of runs (plan.release_dir)."""
    from doctor_lab.backtest.plan import release_dir
    p = install_error_path(root, release_dir(release, library))
    try:
        releases.install(release, pinned, log=log, library=library)
    except (RuntimeError, OSError) as e:  # pip failed, or the cache cannot be written: the release is not run
        write_json(p, {"release": release, "error": " ".join(str(e).split())[:400]})
        return False
    p.unlink(missing_ok=True)
    return True


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def zoo_command(release: str, pinned: Path, out: Path, arch: str, impls, checks, cpu_s: int,
                config: tuple = (), extra: tuple = (), library: str = releases.TRANSFORMERS) -> list[str]:
    if library != releases.TRANSFORMERS:   # its release comes first on the path (library_env); no configs to give
        from doctor_lab.backtest.plan import ZOOS
        return [sys.executable, "-m", ZOOS[library], "--target", arch, "--path", ",".join(impls),
                "--checks", ",".join(checks), "--out", str(Path(out).resolve()), "--workers", "1",
                "--timeout", str(ZOO_TIMEOUT_S), "--cpu", str(cpu_s)]
    return [sys.executable, "-m", "doctor_lab.zoo", "--release", release, "--pinned", str(Path(pinned).resolve()),
            "--arch", arch, "--impl", ",".join(impls), "--checks", ",".join(checks),
            "--out", str(Path(out).resolve()), "--no-confirm", "--workers", "1",
            "--timeout", str(ZOO_TIMEOUT_S), "--cpu", str(cpu_s)] + (
        ["--init", *(f"{k}={json.dumps(v)}" for k, v in config)] if config else []) + list(extra)


@functools.cache
def _doctor_hash() -> str:
    from doctor_lab.zoo.runner import doctor_hash
    return doctor_hash()


def current(out: Path, release: str, arch: str, impls, checks, shrink: dict, config: tuple = ()) -> bool:
    """Every implementation of `arch` has a result the zoo would keep and zoo.json holds it: the call can
    be skipped (a resumed backtest costs no import per done architecture). The key is the one the zoo
    stamps on a result (doctor_lab/zoo/__main__.py: shrink entry, doctor, release, checks); should the
    zoo's change, no result matches and the zoo is called: a drift costs a call, never a stale row."""
    from doctor_lab.zoo.runner import done
    from doctor_lab.zoo.shrink import entry_hash, with_init
    key = f"{entry_hash(arch, with_init(shrink, [arch], dict(config)))}-{_doctor_hash()}-tf{release}-{','.join(checks)}"
    try:
        tabled = {(r["arch"], r["impl"]) for r in json.loads((Path(out) / "zoo.json").read_text())["results"]}
    except (OSError, ValueError, KeyError):
        return False
    return all(done(out, arch, i, key) and (arch, i) in tabled for i in impls)


def library_env(release: str, pinned: Path, library: str) -> dict | None:
    """The environment of another library's zoo: its release's directory, then the clone, on PYTHONPATH
    (transformers' zoo puts its release there itself: None, the inherited one)."""
    if library == releases.TRANSFORMERS:
        return None
    d = releases.directory(Path(pinned).resolve(), release, library)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(d), str(ROOT)])}


def run_arch(release: str, pinned: Path, out: Path, arch: str, impls, checks, cpu_s: int = 300,
             config: tuple = (), extra: tuple = (), library: str = releases.TRANSFORMERS) -> dict:
    """One zoo call; its attempt record (exit code, its last line, seconds), also written to attempts/.
    extra: more arguments (the option zoo's)."""
    t0 = time.monotonic()
    cmd = zoo_command(release, pinned, out, arch, impls, checks, cpu_s, config, extra, library)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=ZOO_TIMEOUT_S + SLACK_S,
                           env=library_env(release, pinned, library))
        rc, said = r.returncode, _last_line(r.stderr if r.returncode else r.stdout) or _last_line(r.stderr)
    except subprocess.TimeoutExpired:
        rc, said = 124, f"the zoo did not finish in {ZOO_TIMEOUT_S + SLACK_S} s"
    attempt = {"release": release, "arch": arch, "impls": list(impls), "checks": list(checks), "rc": rc,
               "said": said, "seconds": round(time.monotonic() - t0, 1)}
    write_json(attempt_path(out, arch), attempt)
    return attempt


def read_attempt(out: Path, arch: str) -> dict | None:
    try:
        return json.loads(attempt_path(out, arch).read_text())
    except (OSError, ValueError):
        return None


def read_install_error(root: Path, release: str) -> str | None:
    try:
        return json.loads(install_error_path(root, release).read_text())["error"]
    except (OSError, ValueError, KeyError):
        return None
