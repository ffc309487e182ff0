"""Report sections: each module here with

    NAME = "heads"                                  # README marker: <!-- BEGIN report:heads -->
    def render(runs: list[RunRecord], fig_dir: Path) -> str | None

is one section of REPORT.md, in the order of report.build.SECTIONS (a new section is added there;
tests/test_report.py holds every module here to that list). `runs` are the records
(experiments.records.RunRecord) of every run found: failures, baselines and their controls (`role`
says which; a failure's `control_run` is its control's record); `run.metrics_frame()` reads a
run's metrics.csv. A section writes its PNGs into fig_dir and links them as `figures/<file>`
(REPORT.md sits beside figures/). It returns markdown, or None when none of its runs exist (the
section is then left out). `TEXT = True`: the section sees the runs on text data as well.
Rendering must be deterministic: same runs in, same bytes out (no timestamps, no absolute paths).
"""
