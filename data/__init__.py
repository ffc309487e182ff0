"""Datasets: seeded synthetic tasks and char-level text. `build_task` picks one by data.name."""
from data.synthetic import Batch, Task, build_task

__all__ = ["Batch", "Task", "build_task"]
