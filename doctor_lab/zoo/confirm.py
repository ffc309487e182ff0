"""Before a fail or warn is called a new finding: its check rerun under each condition of
doctor_lab/zoo/conditions.py, in a process of its own per architecture (the runner's caps).
Writes <out>/confirm/<arch>__<impl>.json: per check, per condition, the verdict and its number."""
import time
import traceback
from pathlib import Path

from doctor_lab.zoo.conditions import CONDITIONS
from doctor_lab.zoo.worker import NotBuilt, _cpu, _is_memory, _line, build, settle, stand_ins


def confirm_path(out: Path, arch: str, impl: str) -> Path:
    return Path(out) / "confirm" / f"{arch}__{impl}.json"


def rerun(arch: str, impl: str, table: dict, checks: list[str], cond) -> dict:
    """{check: {verdict, measured, detail}} of `checks` on `arch` x `impl` under `cond`, and
    `changed`: what the condition changed in the model (a condition with nothing to change is
    n/a for every check)."""
    import torch

    from attention_doctor import examine
    try:
        _, model, cfg = build(arch, impl, table, seed=cond.seed)
    except NotBuilt as e:
        return {"error": e.result.get("reason", "not built")}
    changed = cond.prepare(model, cfg) if cond.prepare else ""
    if cond.prepare and not changed:
        return {"changed": "", **{c: {"outcome": "n/a", "reason": f"{cond.what}: nothing to change"} for c in checks}}
    with stand_ins(arch, table, cfg):
        r = examine(model, name=f"hf:{arch} {impl} ({cond.name})", checks=checks, seed=cond.seed,
                    dtype=getattr(torch, cond.dtype))
    rows = {c.name: {"outcome": c.outcome.value, "reason": c.reason, "cause": c.cause, "measured": c.measured,
                     "detail": c.detail} for c in r.checks}
    return {"changed": changed, **rows}


def run_confirm(arch: str, impls: list[str], out: str, checks: dict, table: dict, key: str,
                mem_bytes: int | None = None, cpu_s: int | None = None):
    """The body of one architecture's confirm process (runner.run forks it): checks is
    {impl: [check names]}; one file per implementation, written when all conditions ran."""
    from experiments.io import write_json
    settle(Path(out) / "logs" / f"{arch}.confirm.log", mem_bytes, cpu_s)
    for impl in impls:
        t0, c0 = time.perf_counter(), _cpu()
        res = {"arch": arch, "impl": impl, "checks": checks[impl], "conditions": {}}
        for cond in CONDITIONS:
            print(f"== {arch} {impl} {cond.name}: {', '.join(checks[impl])}", flush=True)
            try:
                res["conditions"][cond.name] = rerun(arch, impl, table, checks[impl], cond)
            except Exception as e:  # noqa: BLE001 -- a condition's rerun raised: that condition's row says so ({error}), never a pass
                if _is_memory(e):
                    raise
                traceback.print_exc()
                res["conditions"][cond.name] = {"error": _line(e)}
        res.update(shrink_hash=key, cpu_s=round(_cpu() - c0, 2), wall_s=round(time.perf_counter() - t0, 2))
        write_json(confirm_path(Path(out), arch, impl), res)
