"""Datasets: seeded synthetic tasks, char-level text and byte-pair text. `build_task` picks one by data.name."""
from data.bpe import BpeText
from data.synthetic import TASKS, Batch, Task, build_task
from data.text import CharLines, CharText, ChichewaChar, ChichewaLines, PythonSourceChar, PythonSourceLines

TASKS["shakespeare_char"] = CharText  # registered here: data.text imports data.synthetic
TASKS["shakespeare_lines"] = CharLines
TASKS["python_source_char"] = PythonSourceChar
TASKS["python_source_lines"] = PythonSourceLines
TASKS["chichewa_char"] = ChichewaChar
TASKS["chichewa_lines"] = ChichewaLines
TASKS["bpe_text"] = BpeText  # the lesson's 32k byte-pair vocabulary (data/bpe.py)

__all__ = ["Batch", "Task", "build_task"]
