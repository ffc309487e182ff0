"""The x-transformers zoo in the report (doctor_lab/report/library_zoo.py renders it): every option
of options.yaml and the pairs that share code, flash and einsum, from results/zoo_xt/<version>/,
triaged by doctor_lab/zoo_xt/triage.yaml; the problems over the releases examined."""
from pathlib import Path

from doctor_lab.report import library_zoo, triage

NAME = "zoo_xt"
TITLE = "## The x-transformers zoo: every attention option under the doctor"
# x-transformers' words for an option it does not know (a release before the option): not a row
ABSENT = ("unrecognized kwargs", "unexpected keyword argument")
TRIAGE = triage.Spec(Path(__file__).resolve().parents[2] / "zoo_xt" / "triage.yaml", library_zoo.FLAGGED, ABSENT)
LIBRARY = library_zoo.Library(
    name=NAME, title=TITLE[3:], library="x-transformers", results="zoo_xt", command="python -m doctor_lab.zoo_xt",
    about=("builds a small `TransformerWrapper` + `Decoder` (random weights, no download) for each attention option of "
           "`Attention` / `AttentionLayers` that a decoder-only LM accepts, one at a time, and for the pairs of options "
           "that share code (`doctor_lab/zoo_xt/options.yaml` says which and why, and why an option is not examined), "
           "each with `attn_flash=True` (SDPA) and `False` (its einsum path, its own softmax): a forward and a KV-cache "
           "step, then the doctor's checks;"),
    spec=TRIAGE, target="target")

blocks = LIBRARY.blocks   # the section (`zoo_xt`) and its README line (`zoo_xt_summary`); none without a table
