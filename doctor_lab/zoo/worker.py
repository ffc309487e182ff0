"""One architecture, in its own process: build the shrunk model once per attention
implementation, run a forward and a KV-cache step, then the doctor; one result file per
implementation, written atomically (a crash leaves none, and the runner writes the row)."""
import inspect
import os
import resource
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

from experiments.io import write_json

# statuses of a result file (the runner adds timeout, crash and memory for a process that died)
EXAMINED = "examined"          # the doctor ran its checks
NOT_BUILT = "build_error"      # the config or the model could not be built
NO_FORWARD = "forward_error"   # built, but a plain forward or a cache step raised
UNSUPPORTED = "unsupported"    # the architecture does not offer this attention implementation
TARGET_ERROR = "doctor_target_error"  # the doctor could not use the model (its TargetError)
DOCTOR_ERROR = "doctor_error"  # the doctor itself raised (a doctor bug, not the model's)
SKIPPED = "skipped"            # the shrink table says why it is not examined
MEMORY = "memory"              # an allocation failed under the memory cap


def result_path(out: Path, arch: str, impl: str) -> Path:
    return Path(out) / "runs" / f"{arch}__{impl}.json"


def limit(mem_bytes: int | None, cpu_s: int | None):
    """Caps on this process: address space (an allocation past it raises) and CPU seconds (past
    it the kernel ends the process with SIGXCPU: a busy hang is a row, not a stuck worker)."""
    if mem_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    if cpu_s:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _line(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg}"[:300]


def _is_memory(e: BaseException) -> bool:
    return isinstance(e, MemoryError) or "can't allocate memory" in str(e) or "std::bad_alloc" in str(e)


def _params(fn) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def smoke(model, vocab: int) -> dict:
    """A forward on (2, 8) ids, then a prefill of 6 and a step of 2 through the cache; what the
    step returned is compared against the full forward (a number, not a verdict: the doctor's
    kv_cache check judges it)."""
    import torch
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (2, 8), generator=gen)
    dec = {"decoder_input_ids": ids} if "decoder_input_ids" in _params(model.forward) else {}   # an encoder-decoder
    with torch.no_grad():
        try:
            full = model(input_ids=ids, use_cache=False, **dec).logits
            out = {}
        except Exception as e:  # noqa: BLE001 -- raising with no mask only (the doctor's checks judge it): run masked
            if _is_memory(e):
                raise
            full = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, **dec).logits
            out = {"unmasked_raised": _line(e)}
        out.update(logits_shape=list(full.shape), logits_finite=bool(torch.isfinite(full).all()))
        try:
            pre = model(input_ids=ids[:, :6], use_cache=True, **{k: v[:, :6] for k, v in dec.items()})
            cache = getattr(pre, "past_key_values", None)
            if cache is None:
                out["cache"] = "no past_key_values returned"
            else:
                step = model(input_ids=ids[:, :6] if dec else ids[:, 6:], past_key_values=cache, use_cache=True,
                             **{k: v[:, 6:] for k, v in dec.items()}).logits
                err = (step - full[:, 6:]).abs().max() / full[:, 6:].abs().max().clamp_min(1e-30)
                out["cache"] = "ran"
                out["cache_step_rel_err"] = float(err)
        except Exception as e:  # noqa: BLE001 -- the smoke's cache step raised: recorded in smoke, the doctor's kv_cache check judges it
            if _is_memory(e):
                raise
            out["cache"] = f"raised {_line(e)}"
    return out


def _vocab(model, cfg) -> int:
    """Ids below this are valid (an embedding may be a list of them: MusicGen's codebooks)."""
    v = getattr(cfg, "vocab_size", None)
    if isinstance(v, int):
        return v
    emb = model.get_input_embeddings()
    return getattr(emb, "num_embeddings", 2)


class NotBuilt(Exception):
    """The model could not be built; .result is the row that says why (status, stage, reason)."""

    def __init__(self, result: dict):
        super().__init__(result.get("reason", ""))
        self.result = result


@contextmanager
def standing_in(configs: list):
    """While a model is built, and examined: the towers AutoModel.from_config would build from
    sub-configs of these configs' classes (a vision tower that needs a library this machine lacks)
    are StandIn modules; the text path the doctor drives is built whole. By class, so that the model
    from_pretrained rebuilds (config_roundtrip) stands in the same tower."""
    from transformers import AutoModel
    original = AutoModel.__dict__["from_config"]
    kinds = tuple({type(c) for c in configs})

    def from_config(cls, config, *a, **kw):
        if type(config) in kinds:
            return StandIn(type(config).__name__)
        return original.__func__(cls, config, *a, **kw)
    if configs:
        AutoModel.from_config = classmethod(from_config)
    try:
        yield
    finally:
        AutoModel.from_config = original


def stand_ins(arch: str, table: dict, cfg):
    """standing_in over the sub-configs an architecture's shrink entry names (stand_in)."""
    return standing_in([getattr(cfg, n) for n in (table["archs"].get(arch) or {}).get("stand_in", [])])


def StandIn(name: str):
    """An empty module in a tower's place (built from a config of class `name`); its forward
    raises: the text path the zoo drives never calls it."""
    import torch.nn as nn

    class StandIn(nn.Module):
        def forward(self, *args, **kwargs):
            raise RuntimeError(f"a stand-in for a tower built from {name}: the zoo drives the text path only")
    return StandIn()


def build(arch: str, impl: str, table: dict, seed: int = 0, options: dict | None = None):
    """(the row so far, the shrunk model in eval mode, its config), built as every zoo row
    builds it: torch seeded with `seed`, then the table's config (with `options`: shrink.make_config).
    NotBuilt says why not."""
    import torch
    import transformers

    from doctor_lab.zoo import kinds
    from doctor_lab.zoo.shrink import NotExamined, make_config

    entry = table["archs"].get(arch) or {}
    kind, cls_name, auto = kinds.of(arch, [entry["kind"]] if entry.get("kind") else []) or (
        "causal_lm", None, "AutoModelForCausalLM")
    res = {"arch": arch, "impl": impl, "class": cls_name}
    if kind != "causal_lm":
        res["kind"] = kind
    if entry.get("why"):
        res["shrink"] = entry["why"]
    try:
        cfg = make_config(arch, table, options)
    except NotExamined as e:
        raise NotBuilt({**res, "status": SKIPPED, "reason": str(e)}) from None
    except Exception as e:  # noqa: BLE001 -- transformers' config raised: status not_built (stage config), never a verdict
        if _is_memory(e):
            raise
        raise NotBuilt({**res, "status": NOT_BUILT, "stage": "config", "reason": _line(e)}) from None
    torch.manual_seed(seed)
    try:
        with stand_ins(arch, table, cfg):
            if entry.get("use"):  # a sub-config: the mapped class takes it directly
                cls = getattr(transformers, res["class"])
                model = cls._from_config(cfg, attn_implementation=impl).eval()
            else:
                model = getattr(transformers, auto).from_config(cfg, attn_implementation=impl).eval()
    except Exception as e:  # noqa: BLE001 -- the model's build raised: status unsupported or not_built, never a verdict
        if _is_memory(e):
            raise
        unsupported = "does not support an attention implementation" in str(e) or (
            "not supported" in str(e) and impl in str(e))
        raise NotBuilt({**res, "status": UNSUPPORTED if unsupported else NOT_BUILT, "stage": "model",
                        "reason": _line(e)}) from None
    return res, model, cfg


def examine_one(arch: str, impl: str, table: dict, checks, options: dict | None = None) -> dict:
    """The result of one architecture x implementation (never raises, except for memory)."""
    try:
        res, model, cfg = build(arch, impl, table, options=options)
    except NotBuilt as e:
        return e.result
    with stand_ins(arch, table, cfg):
        return _examined(res, model, cfg, arch, impl, checks)


def _examined(res, model, cfg, arch, impl, checks) -> dict:
    """examine_one's smoke test and doctor on the model built."""
    res["params"] = sum(p.numel() for p in model.parameters())
    res["impl_used"] = getattr(model.config, "_attn_implementation", None)
    try:
        res["smoke"] = smoke(model, _vocab(model, cfg))
    except Exception as e:  # noqa: BLE001 -- the plain forward raised before the doctor: status no_forward, with its trace
        if _is_memory(e):
            raise
        return {**res, "status": NO_FORWARD, "stage": "forward", "reason": _line(e),
                "trace": traceback.format_exc(limit=-4)}
    if checks == []:  # a build-and-forward run only
        return {**res, "status": "ran"}
    return run_doctor(res, model, f"hf:{arch} {impl}", checks)


def run_doctor(res: dict, target, name: str, checks) -> dict:
    """res with the doctor's rows on target (a module or an Adapter), or with why there are none."""
    from attention_doctor import TargetError, examine
    try:
        r = examine(target, name=name, checks=checks, seed=0)
    except TargetError as e:
        return {**res, "status": TARGET_ERROR, "stage": "doctor", "reason": str(e)[:300]}
    except Exception as e:  # noqa: BLE001 -- the doctor's own exception: a doctor_error row, triaged as a false alarm
        if _is_memory(e):
            raise
        return {**res, "status": DOCTOR_ERROR, "stage": "doctor", "reason": _line(e),
                "trace": traceback.format_exc(limit=-4)}
    d = r.to_dict()
    return {**res, "status": EXAMINED, "checks": d["checks"], "info": d.get("info", {})}


def settle(log: Path, mem_bytes: int | None, cpu_s: int | None) -> None:
    """A forked worker's start: its caps, its output into `log`, one torch thread."""
    limit(mem_bytes, cpu_s)
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    import torch
    torch.set_num_threads(1)


def run_arch(arch: str, impls: list[str], out: str, checks, table: dict, table_hash: str,
             mem_bytes: int | None = None, cpu_s: int | None = None, *, examine=None):
    """The body of one architecture's process (the runner forks it): caps, quiet logs, then
    one result file per implementation. examine(arch, impl, table, checks) -> result (default:
    examine_one; another zoo passes its own)."""
    examine = examine or examine_one
    settle(Path(out) / "logs" / f"{arch}.log", mem_bytes, cpu_s)
    for impl in impls:
        t0, c0 = time.perf_counter(), _cpu()
        print(f"== {arch} {impl}", flush=True)
        try:
            res = examine(arch, impl, table, checks)
        except Exception as e:  # noqa: BLE001  a row of status memory (_is_memory: the cap was hit; the next
            # implementation may fit) or crash, with its traceback printed: never a pass
            traceback.print_exc()
            res = {"arch": arch, "impl": impl, "status": MEMORY if _is_memory(e) else "crash",
                   "reason": _line(e)}
        res.update(shrink_hash=table_hash, cpu_s=round(_cpu() - c0, 2), wall_s=round(time.perf_counter() - t0, 2))
        write_json(result_path(Path(out), arch, impl), res)
        print(f"== {arch} {impl}: {res['status']} {res.get('reason', '')}", flush=True)
        sys.stdout.flush()
