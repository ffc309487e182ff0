"""attention-doctor TARGET [--attn-impl eager|sdpa] [--checks a,b] [--json F] [--device D] [--dtype T]
(also `python -m attention_doctor`).

Exit 0: every applicable check ran and held; 1: a check failed; 2: the target or an optional
dependency is unusable (one line on stderr naming the fix, nothing written); 3: nothing failed
but a check was inconclusive."""
import argparse
import os
import sys

from attention_doctor.result import EXIT_UNUSABLE

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
docs: docs/doctor.md (the checks, their tolerances, the adapter protocol)"""


def parser():
    p = argparse.ArgumentParser(prog="attention-doctor", description="Look for the catalogue's attention bugs in a target.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target")
    p.add_argument("--attn-impl", default=None, help="hf: targets: transformers' attn_implementation (eager, sdpa)")
    p.add_argument("--checks", default=None, help="comma-separated check names to run (default: all, in order)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the rows as JSON")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", help="float32 (default), float64, bfloat16, float16")
    p.add_argument("--causal", choices=("yes", "no"), default=None, help="a layer: causal or not (default: found out)")
    p.add_argument("--details", action="store_true", help="print each check's detail under the table")
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
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch

    from attention_doctor.examination import examine
    from attention_doctor.signals import TargetError
    from attention_doctor.targets import resolve
    try:
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise TargetError(f"--device {args.device}: no CUDA device here")
        if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
            raise TargetError(f"--json {args.json}: its directory does not exist")
        checks = None if args.checks is None else [c for c in args.checks.split(",") if c]
        model = resolve(args.target, args.attn_impl)
        causal = None if args.causal is None else args.causal == "yes"
        result = examine(model, causal=causal, device=args.device, dtype=args.dtype, name=args.target, checks=checks)
    except TargetError as e:
        print(f"attention-doctor: {e}", file=sys.stderr)
        return EXIT_UNUSABLE
    print(result.table())
    if args.details:
        print(result.details())
    if args.json:
        result.to_json(args.json)
    return result.exit_code
