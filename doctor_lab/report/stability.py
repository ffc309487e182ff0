"""The stability benchmark's record (python -m doctor_lab.stability writes it, the lab's report renders
it): its runs compared, per target, against the first run. Here, below both, so the two read one rule."""

HEALTHY_EXITS = (0, 3)   # a healthy target passes or is inconclusive; 1 is a fail, 2 a refusal


def flips(runs: list[dict]) -> dict[str, dict[str, int]]:
    """{target: {check: runs whose (outcome, cause) differ from the first run's}} (a row absent in a
    run, or a run that could not examine the target, counts as a flip)."""
    first = runs[0]
    out = {}
    for name in first:
        base = first[name].get("rows", {})
        checks = set(base).union(*(r.get(name, {}).get("rows", {}) for r in runs[1:]))
        out[name] = {c: sum(r.get(name, {}).get("rows", {}).get(c) != base.get(c) for r in runs[1:]) for c in sorted(checks)}
        out[name]["(error)"] = sum(("error" in r.get(name, {"error": 1})) != ("error" in first[name]) for r in runs[1:])
    return out


def exit_codes(runs: list[dict], name: str, key: str = "exit_code") -> list:
    """The exit codes a target's runs gave (key bare_exit_code: without its documented hazards), sorted;
    "error" for a run that could not examine it."""
    return sorted({r.get(name, {}).get(key, "error") for r in runs}, key=str)


def off_runs(runs: list[dict]) -> int:
    """Target-runs that exited other than HEALTHY_EXITS (or could not examine their target)."""
    return sum(r.get(name, {}).get("exit_code") not in HEALTHY_EXITS for r in runs for name in runs[0])


def totals(runs: list[dict]) -> tuple[int, int, int]:
    """(flips, target-checks compared, target-runs off): the benchmark's verdict, 0 flips and 0 off."""
    f = flips(runs)
    return sum(sum(v.values()) for v in f.values()), sum(len(v) - 1 for v in f.values()), off_runs(runs)
