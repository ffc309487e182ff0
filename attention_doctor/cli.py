"""attention-doctor TARGET [--attn-impl eager|sdpa] [--checks a,b] [--json F] [--device D] [--dtype T]
[--baseline F] [--write-baseline F] [--format text|markdown|github]; attention-doctor --against OLD.json
NEW.json (also `python -m attention_doctor`).

Exit 0: every applicable check ran and held; 1: a check failed; 2: the target or an optional
dependency is unusable (one line on stderr naming the fix, nothing written); 3: nothing failed
but a check was inconclusive."""
import argparse
import os
import sys

from attention_doctor.formats import FORMATS, render
from attention_doctor.result import EXIT_FAILED, EXIT_INCONCLUSIVE, EXIT_OK, EXIT_UNUSABLE

EPILOG = """targets:
  pkg.module:obj            a torch module or an attention_doctor.Adapter: an instance, a class or a
                            zero-argument factory (pkg.module is imported from the working directory)
  path/to/file.py:obj       the same from a file
  hf:NAME                   a transformers causal LM of model type NAME (llama, gpt2, ...) from a small
                            config, random weights, no download; needs transformers:
                            pip install -r requirements-validation.txt
                            (in the clone: the transformers release the zoo pins)
  self:                     this project's LM from conf/ (run from inside the clone; needs Hydra)
  'self:KEY=VAL KEY=VAL'    the same with Hydra overrides, e.g. self:model.attention.merge=no_transpose
  xt:OPTION=VALUE,...       an x-transformers TransformerWrapper + Decoder with these options, small, random
                            weights (needs x-transformers), e.g. xt:rotary_pos_emb=True,attn_flash=True
  diffusers:PROCESSOR[,cross][,ARG=VALUE...]
                            a diffusers attention module with this processor, self- or cross-attention
                            (needs diffusers), e.g. diffusers:AttnProcessor2_0,cross
outcomes: pass; fail (with its cause); warn (holds only with what the caller must pass, said in the
  row); n/a: why (the target cannot have the failure, or lacks the interface by nature);
  inconclusive: why (the check applies but the doctor could not perform it: never a pass)
exit codes:
  0  every applicable check ran and held (n/a rows aside; a warn row held with what it names)
  1  a check failed
  2  the target or an optional dependency is unusable: one line on stderr naming the fix, nothing written
  3  nothing failed, but a check was inconclusive
  (--baseline FILE: a fail or inconclusive the baseline expects does not count; --baseline-strict: an
  expected failure that did not happen is 1)
  --against OLD.json NEW.json: 1 a check newly fails, warns or changed its cause; 3 one newly
  inconclusive; 0 otherwise (fixed, or nothing changed)
docs: docs/doctor.md (the checks, their tolerances, the adapter protocol)"""


def parser():
    p = argparse.ArgumentParser(prog="attention-doctor", description="Look for the catalogue's attention bugs in a target.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", help="what to examine (below); with --against, the NEW result's JSON")
    p.add_argument("--attn-impl", default=None, help="hf: targets: transformers' attn_implementation (eager, sdpa)")
    p.add_argument("--checks", default=None, help="comma-separated check names to run (default: all, in order)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the rows as JSON")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", help="float32 (default), float64, bfloat16, float16")
    p.add_argument("--causal", choices=("yes", "no"), default=None, help="a layer: causal or not (default: found out)")
    p.add_argument("--details", action="store_true", help="print each check's detail under the table")
    p.add_argument("--format", choices=FORMATS, default="text",
                   help="text (the table, at most 100 columns), markdown (a pull request comment), github "
                        "(one ::error annotation per failing check, then the table)")
    p.add_argument("--baseline", default=None, metavar="FILE", help="the expected outcomes, JSON (docs/doctor.md)")
    p.add_argument("--baseline-strict", action="store_true",
                   help="an expected failure of the baseline that did not happen fails (exit 1)")
    p.add_argument("--write-baseline", default=None, metavar="FILE",
                   help="write today's fail and inconclusive rows as a draft baseline for a person to edit")
    p.add_argument("--against", default=None, metavar="OLD.json",
                   help="print what changed from OLD.json to TARGET (NEW.json, both written by --json)")
    return p


class _ArgError(Exception):
    pass


def main(argv=None) -> int:
    p = parser()
    p.error = lambda msg: (_ for _ in ()).throw(_ArgError(msg))   # one line, exit 2, no usage dump
    try:
        args = p.parse_args(argv)
    except _ArgError as e:
        print(f"attention-doctor: {e}", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.against:
        return against(args.against, args.target)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch

    from attention_doctor.examination import examine
    from attention_doctor.signals import TargetError
    from attention_doctor.targets import resolve
    try:
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise TargetError(f"--device {args.device}: no CUDA device here")
        for flag, path in (("--json", args.json), ("--write-baseline", args.write_baseline)):
            if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
                raise TargetError(f"{flag} {path}: its directory does not exist")
        baseline = _baseline(args.baseline, args.baseline_strict)
        checks = None if args.checks is None else [c for c in args.checks.split(",") if c]
        model = resolve(args.target, args.attn_impl)
        causal = None if args.causal is None else args.causal == "yes"
        result = examine(model, causal=causal, device=args.device, dtype=args.dtype, name=args.target, checks=checks,
                         baseline=baseline)
    except TargetError as e:
        print(f"attention-doctor: {e}", file=sys.stderr)
        return EXIT_UNUSABLE
    print(render(result, args.format))
    if args.details:
        print(result.details())
    if args.json:
        result.to_json(args.json)
    if args.write_baseline:
        from attention_doctor.baseline import draft
        d = draft(result)
        d.save(args.write_baseline)
        print(f"attention-doctor: wrote {len(d.entries)} expected row(s) to {args.write_baseline}: a draft, "
              "give each its reason", file=sys.stderr)
    return result.exit_code


def _baseline(path, strict):
    """The baseline of --baseline (None without one); TargetError (exit 2, one line) if unreadable."""
    from attention_doctor.baseline import Baseline
    from attention_doctor.signals import TargetError
    if path is None:
        if strict:
            raise TargetError("--baseline-strict needs --baseline FILE")
        return None
    try:
        b = Baseline.load(path)
    except ValueError as e:
        raise TargetError(str(e)) from None
    b.strict = b.strict or strict
    return b


def against(old_path: str, new_path: str) -> int:
    """--against: what changed from OLD to NEW (attention_doctor.compare), and its exit code."""
    from attention_doctor.baseline import read_result
    from attention_doctor.compare import between
    from attention_doctor.compare import render as changes
    try:
        old, new = (read_result(p) for p in (old_path, new_path))
    except (OSError, ValueError, KeyError, TypeError) as e:   # not a result file: exit 2, one line
        print(f"attention-doctor: --against: cannot read a result ({type(e).__name__}: {e})", file=sys.stderr)
        return EXIT_UNUSABLE
    print(changes(old, new))
    kinds = {m.kind for m in between(old, new)}
    if kinds & {"new_fail", "cause_changed"}:
        return EXIT_FAILED
    return EXIT_INCONCLUSIVE if "new_blind" in kinds else EXIT_OK
