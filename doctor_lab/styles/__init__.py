"""The doctor's test bed: attention written in notations this project does not use, healthy and
with each catalogue bug they can express (classic: four small causal LMs, see its docstring)."""
from doctor_lab.styles import classic  # noqa: F401  the four styles the evidence and the tests build
