"""DOCTOR.md's sections, in the order of doctor_lab.report.build.SECTIONS: each module has
`blocks(runs, fig_dir) -> {name: markdown}` (runs: always []; the lab's sections read what is
committed beside fig_dir: fig_dir.parent/doctor, zoo, zoo_xt, zoo_diffusers, and the findings the
zoos' triage names in docs/findings/). A block named NAME fills the README's
<!-- BEGIN lab:NAME --> marker; `*_summary` blocks go to the README only."""
