"""The diffusers zoo in the report (doctor_lab/report/library_zoo.py renders it): every attention
processor of diffusers.models.attention_processor, as self- and cross-attention, from
results/zoo_diffusers/<version>/, triaged by doctor_lab/zoo_diffusers/triage.yaml."""
from pathlib import Path

from doctor_lab.report import library_zoo, triage

NAME = "zoo_diffusers"
TITLE = "## The diffusers zoo: every attention processor under the doctor"
TRIAGE = triage.Spec(Path(__file__).resolve().parents[2] / "zoo_diffusers" / "triage.yaml", library_zoo.FLAGGED)
LIBRARY = library_zoo.Library(
    name=NAME, title=TITLE[3:], library="diffusers", results="zoo_diffusers", command="python -m doctor_lab.zoo_diffusers",
    about=("puts each attention processor class of `diffusers.models.attention_processor` in a small `Attention` "
           "module that holds it (random weights, no download; `attention_doctor/diffusers.py`'s PROCESSORS says how "
           "each is driven, or why it cannot run here), as self-attention and as cross-attention, the doctor's masks "
           "on and off inside its checks;"),
    spec=TRIAGE, target="processor")

blocks = LIBRARY.blocks   # the section (`zoo_diffusers`) and its README line (`zoo_diffusers_summary`); none without a table
