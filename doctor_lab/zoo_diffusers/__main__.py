"""The diffusers zoo: each attention processor of diffusers.models.attention_processor, as self- and
as cross-attention (the doctor's masks on and off inside its checks), examined by the attention doctor.

    python -m doctor_lab.zoo_diffusers                                  # every processor, self and cross
    python -m doctor_lab.zoo_diffusers --target AttnProcessor2_0 JointAttnProcessor2_0 --path cross

Writes <out>/runs/<processor>__<self|cross>.json (a rerun skips those done with the same recipe,
release and doctor), <out>/logs/, <out>/zoo.csv + zoo.json, <out>/cost.json; out is
results/zoo_diffusers/<version>.
"""
import argparse
import hashlib
import json
import sys
from pathlib import Path

from doctor_lab.zoo import library

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "results" / "zoo_diffusers"
PROG = "python -m doctor_lab.zoo_diffusers"
PATHS = ("self", "cross")


def main(argv=None):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    a = library.arguments(p, PATHS).parse_args(argv)
    try:
        import diffusers

        from attention_doctor import diffusers as adapter
    except ImportError as e:
        library.fail(PROG, f"needs diffusers ({e}); pip install diffusers")
    from attention_doctor import TargetError, Unsupported
    names = adapter.processor_names()
    chosen, impls, checks = library.selected(PROG, a, names, PATHS)
    a.out = a.out or OUT / diffusers.__version__
    import torch
    meta = {"library": "diffusers", "version": diffusers.__version__, "torch": torch.__version__,
            "table": "attention_doctor/diffusers.py PROCESSORS"}

    def build(name, path):
        r = adapter.recipe(name)
        if "cannot" in r:
            raise library.NotExamined(f"cannot run here: {r['cannot']}")
        if path in r.get("modes", {}):
            raise Unsupported(f"no {path}-attention: {r['modes'][path]}")
        try:
            return adapter.build(f"{name},{path}")
        except TargetError as e:
            raise TargetError(str(e).split(": ", 1)[-1]) from None

    def entry_hash(name):
        return hashlib.sha1(json.dumps(adapter.recipe(name), sort_keys=True, default=str).encode()).hexdigest()[:12]

    s = library.run(PROG, a, names, chosen, impls, checks, build, entry_hash, meta,
                    preload=preload)
    print(f"{PROG}: diffusers {meta['version']}: {s['examined']} of {s['targets']} processors examined; {a.out}/zoo.csv")
    return 0


def preload():
    """Imported before the workers fork (each inherits them)."""
    import torch  # noqa: F401
    from diffusers.models import attention_processor  # noqa: F401

    import attention_doctor.diffusers  # noqa: F401


if __name__ == "__main__":
    sys.exit(main())
