"""The x-transformers zoo across releases: each release's table (results/zoo_xt/<version>/zoo.json)
triaged by doctor_lab/zoo_xt/triage.yaml, one row per problem with the first release examined
that has it and the first after its last that no longer has it (doctor_lab/report/releases.py,
as for transformers); an option a release does not have yet is `absent` there, not a row."""
from pathlib import Path

from experiments.io import atomic_write


def write_across(out: Path) -> str:
    """releases.csv in `out` (the zoo's root) from every release's table under it."""
    from doctor_lab.report.releases import load_tables, over_releases, to_csv
    from doctor_lab.report.sections.zoo_xt import TRIAGE
    tables = load_tables(out)
    if not tables:
        return f"no release tables under {out}"
    over = over_releases(tables, spec=TRIAGE)
    text = to_csv(over)
    atomic_write(Path(out) / "releases.csv", lambda f: f.write(text))
    fixed = sum(bool(q["fixed_in"]) for q in over["problems"])
    return (f"{len(over['problems'])} problems over {', '.join(tables)} ({fixed} fixed by a later release): "
            f"{out}/releases.csv")
