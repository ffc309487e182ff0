"""The x-transformers zoo: each option of options.yaml (and each pair) in a small TransformerWrapper +
Decoder, with flash on and off, examined by the attention doctor; one table per release.

    python -m doctor_lab.zoo_xt                                  # the installed x-transformers
    python -m doctor_lab.zoo_xt --target rotary_pos_emb attn_qk_norm --path einsum
    python -m doctor_lab.zoo_xt --release 2.3.27 --pinned ../pinned   # a release in a directory of its own
    python -m doctor_lab.zoo_xt --release all --pinned ../pinned      # every release of RELEASES, then the table across them
    python -m doctor_lab.zoo_xt --across                         # only the table across releases

Writes <out>/runs/<target>__<path>.json (a rerun skips those done with the same entry, release and
doctor), <out>/logs/, <out>/zoo.csv + zoo.json, <out>/cost.json; out is results/zoo_xt/<version>.
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

from doctor_lab.zoo import library
from doctor_lab.zoo_xt import PATHS, TABLE, build, entry_hash, load_table, version

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "results" / "zoo_xt"
PROG = "python -m doctor_lab.zoo_xt"
DEPS = "einops==0.8.2 einx==0.4.3 frozendict==2.5.1 loguru==0.7.3"
# releases examined (two years back from 2.31.x), each installed in a directory of its own under
# --pinned (these commands, run there); 2.x needs torch-einops-utils from 2.2x on, 1.44 einops only
RELEASES = {
    "1.44.8": f"pip install --no-deps --target xt-1.44.8 x-transformers==1.44.8 {DEPS}",
    "2.3.27": f"pip install --no-deps --target xt-2.3.27 x-transformers==2.3.27 {DEPS}",
    "2.11.24": f"pip install --no-deps --target xt-2.11.24 x-transformers==2.11.24 {DEPS}",
    "2.31.10": f"pip install --no-deps --target xt-2.31.10 x-transformers==2.31.10 {DEPS} torch-einops-utils==0.2.0",
}


def parse(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    library.arguments(p, PATHS)
    p.add_argument("--release", nargs="+", help="pinned releases to run (each in its own process), or 'all'")
    p.add_argument("--pinned", type=Path, default=ROOT.parent / "pinned", help="where xt-<version>/ directories are")
    p.add_argument("--across", action="store_true", help="only write the table across releases")
    return p.parse_args(argv)


def main(argv=None):
    a = parse(argv)
    if a.across:
        from doctor_lab.zoo_xt.releases import write_across
        print(f"{PROG}: {write_across(OUT)}")
        return 0
    if a.release:
        return releases(a)
    try:
        import x_transformers  # noqa: F401
    except ImportError as e:
        library.fail(PROG, f"needs x-transformers ({e}); pip install x-transformers, or --release VER --pinned DIR")
    table = load_table()
    names = list(table["targets"]) + list(table["not_examined"])
    chosen, impls, checks = library.selected(PROG, a, names, PATHS)
    v = version()
    a.out = a.out or OUT / v
    meta = {"library": "x-transformers", "version": v, "torch": _torch(), "table": TABLE.name}

    def build_one(name, path):
        if name in table["not_examined"]:
            raise library.NotExamined(table["not_examined"][name])
        return build(name, path, table)

    s = library.run(PROG, a, names, chosen, impls, checks, build_one, lambda n: entry_hash(n, table), meta,
                    preload=preload)
    print(f"{PROG}: x-transformers {v}: {s['examined']} of {s['targets']} targets examined; {a.out}/zoo.csv")
    return 0


def preload():
    """Imported before the workers fork (each inherits them)."""
    import torch  # noqa: F401
    import x_transformers  # noqa: F401

    import attention_doctor.xtransformers  # noqa: F401


def _torch() -> str:
    import torch
    return torch.__version__


def releases(a) -> int:
    """Each release in a process of its own, its directory first on PYTHONPATH; then the table across."""
    if a.out:
        library.fail(PROG, "--out and --release: each release writes results/zoo_xt/<version>")
    wanted = list(RELEASES) if a.release == ["all"] else a.release
    rest = [f"--path={a.path}", f"--workers={a.workers}", f"--timeout={a.timeout}", f"--cpu={a.cpu}",
            f"--mem-gb={a.mem_gb}", f"--checks={a.checks}", *(["--target", *a.target] if a.target else []),
            *(["--redo"] if a.redo else []), *(["--table"] if a.table else [])]
    code = 0
    for v in wanted:
        d = a.pinned / f"xt-{v}"
        if not (d / "x_transformers").is_dir():
            print(f"{PROG}: {d} is missing; install it there with: {RELEASES.get(v, f'pip install --no-deps --target xt-{v} x-transformers=={v} ' + DEPS)}",
                  file=sys.stderr)
            code = 2
            continue
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(d), str(ROOT)])}
        p = subprocess.run([sys.executable, "-m", "doctor_lab.zoo_xt", *rest], cwd=ROOT, env=env)
        code = code or p.returncode
    from doctor_lab.zoo_xt.releases import write_across
    print(f"{PROG}: {write_across(OUT)}")
    return code


if __name__ == "__main__":
    sys.exit(main())
