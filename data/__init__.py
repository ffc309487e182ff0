"""Datasets: seeded synthetic tasks and char-level text. `build_task` picks one by data.name."""
from data.synthetic import TASKS, Batch, Task, build_task
from data.text import CharLines, CharText, ChichewaChar, ChichewaLines, PythonSourceChar, PythonSourceLines

TASKS["shakespeare_char"] = CharText  # registered here: data.text imports data.synthetic
TASKS["shakespeare_lines"] = CharLines
TASKS["python_source_char"] = PythonSourceChar
TASKS["python_source_lines"] = PythonSourceLines
TASKS["chichewa_char"] = ChichewaChar
TASKS["chichewa_lines"] = ChichewaLines

__all__ = ["Batch", "Task", "build_task"]
