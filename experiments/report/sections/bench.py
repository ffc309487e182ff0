"""Benchmark figures in the report: the JSON that `python -m experiments.bench NAME --out
<report dir>/bench/NAME.json` wrote, beside the report's figures dir."""
import json
from pathlib import Path

NAME = "bench"


def _load(fig_dir: Path) -> dict[str, list[dict]]:
    """bench name -> its JSONs (several for shakespeare: one per seed)."""
    d = Path(fig_dir).parent / "bench"
    out: dict[str, list[dict]] = {}
    for p in sorted(d.glob("*.json")) if d.is_dir() else []:
        j = json.loads(p.read_text())
        out.setdefault(j.get("bench", p.stem), []).append(j)
    return out


def _shakespeare(runs: list[dict]) -> str:
    mean = sum(r["val_loss"] for r in runs) / len(runs)
    seeds = ", ".join(f"**{r['val_loss']:.4f}** (seed {r.get('seed', '?')})" for r in runs)
    est20 = [r["val_loss_20"] for r in runs if r.get("val_loss_20", {}).get("n")]
    refs = [r for r in runs if "reference_val_loss" in r]
    s = runs[0]
    text = (f"- **shakespeare** (nanoGPT's CPU config, {s['steps']} steps, {s['threads']} thread(s), "
            f"{sum(r['tokens_per_s'] for r in runs) / len(runs):,.0f} tokens/s): val loss on "
            f"{s['eval_batches']} val batches {seeds}; mean {mean:.4f} against nanoGPT's published 1.88: "
            f"{'met' if mean <= 1.88 else 'not met'}.")
    if est20:
        text += (f" nanoGPT printed its figure from 20 val batches (eval_iters=20); one such estimate of "
                 f"these runs ranges {min(e['min'] for e in est20):.4f} .. {max(e['max'] for e in est20):.4f}.")
    if refs:
        text += (" nanoGPT's own loop, transcribed in `experiments/bench/nanogpt_reference.py` and trained from "
                 "the same seeds, scored on the same batches: "
                 + ", ".join(f"{r['reference_val_loss']:.4f}" for r in refs)
                 + f" (mean {sum(r['reference_val_loss'] for r in refs) / len(refs):.4f}).")
    timed = [r for r in refs if r.get("reference_ms_per_iter")]
    if timed:  # side by side in one process, at the threads the default chose (threads_ran)
        both = sum(r["ms_per_iter"] for r in timed) / sum(r["reference_ms_per_iter"] for r in timed)
        text += (" Time per iteration, ours against nanoGPT's loop at the same threads, the two interleaved in "
                 "chunks of 250 iterations (its estimate_loss every 250 iterations and its checkpoints included, "
                 "as its train.py runs and times them): "
                 + ", ".join(f"{r['ms_per_iter']:.1f} / {r['reference_ms_per_iter']:.1f} ms "
                             f"({r['ms_per_iter'] / r['reference_ms_per_iter']:.2f}x, {r.get('threads_ran', '?')} "
                             f"thread(s))" for r in timed) + f"; {both:.2f}x over the {len(timed)} seed(s).")
    return text


def _throughput(t: dict) -> str:
    on_gpu = t.get("device", "cpu").startswith("cuda")
    where = f"{t.get('gpu')}, {t.get('date', 'undated')}" if on_gpu else f"CPU, {t['threads']} thread(s)"
    size = (f"d_model {t['d_model']}, h {t['n_heads']}, T {t['seq_len']}, batch {t['batch_size']}; "
            if "d_model" in t else "")
    ratios = ", ".join(f"{k}: **{v:.3f}**" for k, v in t["ratio"].items())
    mfu = f"; MFU of the bare loop {t['mfu']:.1%}" if "mfu" in t else ""
    return (f"- **throughput** ({where}; {size}{t['rounds']} interleaved rounds of {t['chunk']} steps, "
            f"ratios on {t['clock']}): bare loop {t['tokens_per_s']['bare']:,.0f} tokens/s; our loop / "
            f"bare loop = {ratios} (targets 0.95 and 0.90){mfu}.")


def _setting(n, rows: list) -> str:
    """A threads setting as the line says it: `auto (ran 2)` for the default, which chose."""
    if isinstance(n, int):
        return f"{n} thread(s)"
    ran = sorted({r.get("ran") for r in rows if r["threads"] == n and r.get("ran") is not None})
    return f"{n} (ran {'/'.join(map(str, ran)) or '?'})"


def _threads(t: dict) -> str:
    """The default run at 1 and 2 torch threads and at the default (auto; experiments/bench/threads.py):
    the figures behind conf/train/cpu.yaml's train.threads."""
    busy = sorted({r["busy"] for r in t["rows"]})
    threads = sorted({r["threads"] for r in t["rows"]}, key=lambda n: (not isinstance(n, int), str(n)))
    vs_best = {int(b): v for b, v in (t.get("default_vs_best") or {}).items()}
    cells = []
    for b in busy:
        mine = [r for r in t["rows"] if r["busy"] == b]
        loads = [r["load_before"] for r in mine]
        times = ", ".join(f"{_setting(n, mine)} **{t['median_s'][f'{b} busy, {n} threads']:.1f} s** "
                          f"({t['median_cpu_s'][f'{b} busy, {n} threads']:.1f} s CPU)" for n in threads)
        best = f"; the default / the best fixed setting **{vs_best[b]:.2f}**" if b in vs_best else ""
        cells.append(f"{b} busy process(es) started beside it (the 1-minute load average before each run "
                     f"{min(loads):.1f}-{max(loads):.1f}): {times}{best}")
    rounds = f"the median of {t['rounds']} rounds" if t["rounds"] > 1 else "one round"
    settings = " and ".join(str(n) for n in threads)
    return (f"- **threads** (`{t['command']}` whole, start-up included: wall time and CPU time, {rounds} of "
            f"{settings} threads in turn, {t['cores']} cores, {t.get('date', 'undated')}): "
            + "; ".join(cells)
            + f". The default: `train.threads={t['default_threads']}` (conf/train/cpu.yaml).")


def _mib(n: float) -> str:
    return f"{n / 2 ** 20:,.0f} MiB" if n < 2 ** 30 else f"{n / 2 ** 30:,.1f} GiB"


def render(summaries: list[dict], fig_dir: Path) -> str | None:
    b = _load(fig_dir)
    if not b:
        return None
    out = ["## Benchmarks\n"]
    if "shakespeare" in b:
        out.append(_shakespeare(b["shakespeare"]))
    for t in b.get("throughput", []):
        out.append(_throughput(t))
    for t in b.get("threads", []):
        out.append(_threads(t))
    if "cost" in b:
        c = b["cost"][-1]
        rows = "\n".join(f"| {r['T']} | {r['proj_flops']:,} | {r['proj_formula']:,} | {r['attn_flops']:,} | "
                         f"{r['attn_formula']:,} | {r['attn_s'] / r['proj_s']:.2f} |" for r in c["rows"])
        out.append(f"- **cost** (d = {c['d']}; FLOPs = 2 x multiply-adds): counted equal to 8Td^2 and 4T^2d "
                   f"exactly: {c['exact']}; crossover predicted T = {c['predicted']}, counted "
                   f"T = {c['counted']}, timed T = {c['timed']}.\n\n"
                   "| T | projection FLOPs | 8Td^2 | attention FLOPs | 4T^2d | time attn / proj |\n"
                   f"|---|---|---|---|---|---|\n{rows}\n")
    if "memory" in b:
        m = b["memory"][-1]
        lesson = "; ".join(f"T = {r['T']}: {_mib(r['per_layer'])} per layer, {_mib(r['12_layers'])} for 12 layers"
                           for r in m["lesson"])
        out.append(f"- **memory**: explicit path's saved weights == B h T^2 bytes exactly: {m['exact']}; "
                   f"SDPA saves no T x T tensor and grows linearly in T: {m['sdpa_linear']}. The lesson's case "
                   f"(B = 32, h = 8, fp16) by the verified formula: {lesson}.")
        for g in (m for m in b["memory"] if m.get("cuda_peak")):  # written by a run on a GPU
            by_t = {}
            for r in g["cuda_peak"]:
                by_t.setdefault(r["T"], []).append(f"{r['backend']} {_mib(r['peak'])}")
            out.append(f"- **peak memory** on {g.get('gpu')} ({g.get('date', 'undated')}; one attention layer, "
                       f"forward + backward, B = 32, h = 8, d = 512, bf16): "
                       + "; ".join(f"T = {T}: {', '.join(v)}" for T, v in by_t.items()) + ".")
    return "\n".join(out) + "\n"
