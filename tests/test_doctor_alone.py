"""Each check gives the same outcome alone as in a full run: it reads the target's description
(decided once, before any check runs), never what another check left behind.

A representative subset, to stay cheap (the full cross product of the styles test bed is minutes):
  - two layers whose causality the doctor must find: the einsum style's attention (causal, found by
    its masks) and nanoGPT's with no causal mask (found bidirectional: fully_masked_rows and
    amplified_logits take their bidirectional branch), every check alone and in a full run;
  - the functional style's LM, whose KV cache keeps autograd history between calls: the checks up to
    fully_masked_rows (whose backward once ran into the history future_leak's left) in one run, and
    each alone.
The public reference implementations (doctor_lab/references.py) the same way, every check,
on request, being minutes of CPU (210 s for the six here): DOCTOR_PINNED names the releases'
directory (docs/doctor.md, "The evidence"), DOCTOR_SOURCES the clones (`name=path;...`, default
../<repository>); skipped, saying so, without them:

    DOCTOR_PINNED=../pinned DOCTOR_SOURCES='Meta Llama=../llama' pytest tests/test_doctor_alone.py -k reference
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attention_doctor import examine
from attention_doctor.checks import ORDER
from conftest import ROOT
from doctor_lab.styles import classic as S


def _same_alone_as_in_a_run(make, checks=ORDER):
    run = examine(make(), checks=checks)
    alone = {c: examine(make(), checks=[c])[c] for c in checks}
    differ = {c: (run[c].verdict, alone[c].verdict) for c in checks if run[c].outcome != alone[c].outcome
              or run[c].cause != alone[c].cause}
    assert not differ, differ
    return run


def _layer(cls, bug):
    def make():
        torch.manual_seed(0)
        return cls(bug).eval()
    return make


@pytest.mark.parametrize("cls,bug,causal", [(S.EinsumAttention, None, True), (S.NanoAttention, "no_causal_mask", False)],
                         ids=["einsum_layer", "nanogpt_layer_no_causal_mask"])
def test_a_layer_whose_causality_is_found(cls, bug, causal):
    run = _same_alone_as_in_a_run(_layer(cls, bug))
    assert run.info["description"]["causal"] is causal
    assert run["fully_masked_rows"].outcome == "n/a" or run["fully_masked_rows"].measurements["layout"] == \
        ("left_padding" if causal else "padding_only_row")


def test_an_lm_that_keeps_autograd_history_in_its_cache():
    run = _same_alone_as_in_a_run(lambda: S.build("functional"), ORDER[:ORDER.index("fully_masked_rows") + 1])
    assert run["fully_masked_rows"].measurements["nonfinite_gradients"] == 0   # the gradient half ran


def _reference_paths(ref):
    """[source, dependencies...] of a reference, or None when one is missing here."""
    pinned = Path(os.environ["DOCTOR_PINNED"])
    given = dict(p.split("=", 1) for p in os.environ.get("DOCTOR_SOURCES", "").split(";") if "=" in p)
    if ref["source"] == "clone":
        src = Path(given.get(ref["name"], ROOT.parent / ref["repo"].split("/")[1]))
    else:
        src = pinned / ref["pinned"]
    paths = [src] + [pinned / d for d in ref.get("needs", [])]
    return [str(p) for p in paths] if all(p.is_dir() for p in paths) else None


# one reference built from its source in a process of its own (its code first on sys.path), every
# check alone and in a full run: {check: [outcome in the run, cause, outcome alone, cause]}
ONE = """
import json, sys
paths, name = json.loads(sys.argv[1]), sys.argv[2]
sys.path[:0] = paths
from doctor_lab.references import BY_NAME
from attention_doctor import examine
from attention_doctor.checks import ORDER
ref = BY_NAME[name]
run = examine(ref["build"](paths[0]), name=name)
out = {}
for c in ORDER:
    r = examine(ref["build"](paths[0]), checks=[c])[c]
    out[c] = [str(run[c].outcome), run[c].cause, str(r.outcome), r.cause]
print(json.dumps(out))
"""


def _references():
    try:
        from doctor_lab.references import REFERENCES
    except ImportError:   # the lab moved; the integrator points this at its new home
        return []
    return REFERENCES


@pytest.mark.parametrize("ref", _references(), ids=lambda r: r["name"])
def test_a_public_reference_alone_and_in_a_full_run(ref):
    if "DOCTOR_PINNED" not in os.environ:
        pytest.skip("minutes of CPU: on request, DOCTOR_PINNED=DIR (and DOCTOR_SOURCES for the clones)")
    paths = _reference_paths(ref)
    if paths is None:
        pytest.skip(f"{ref['name']}: its source is not here (DOCTOR_PINNED, DOCTOR_SOURCES)")
    p = subprocess.run([sys.executable, "-c", ONE, json.dumps(paths), ref["name"]], cwd=ROOT, capture_output=True,
                       text=True, timeout=1800, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    differ = {c: v for c, v in got.items() if v[:2] != v[2:]}
    assert not differ, differ
