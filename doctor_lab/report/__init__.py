"""The doctor's lab's report: results/DOCTOR.md (the doctor's evidence, the three zoos, the findings)
and the README's `lab:` blocks, from the committed JSON and CSV the lab's commands wrote.

    python -m doctor_lab.report [--results results] [--readme README.md]

Pure Python apart from the zoo pictures (matplotlib): never torch. The suite's report
(experiments.report, results/REPORT.md) does not import it.
"""
