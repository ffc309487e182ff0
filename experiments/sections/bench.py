"""Benchmark figures in the report: the JSON that `python -m experiments.bench NAME --out
<report dir>/bench/NAME.json` wrote, beside the report's figures dir."""
import json
from pathlib import Path

NAME = "bench"
ORDER = 60


def _load(fig_dir: Path) -> dict:
    d = Path(fig_dir).parent / "bench"
    return {p.stem: json.loads(p.read_text()) for p in sorted(d.glob("*.json"))} if d.is_dir() else {}


def _mib(n: float) -> str:
    return f"{n / 2 ** 20:,.0f} MiB" if n < 2 ** 30 else f"{n / 2 ** 30:,.1f} GiB"


def render(summaries: list[dict], fig_dir: Path) -> str | None:
    b = _load(fig_dir)
    if not b:
        return None
    out = ["## Benchmarks\n"]
    if "shakespeare" in b:
        s = b["shakespeare"]
        out.append(f"- **shakespeare** (nanoGPT's CPU config, {s['steps']} steps, {s['threads']} thread(s)): "
                   f"val loss **{s['val_loss']:.4f}** on {s['eval_batches']} val batches (nanoGPT's published "
                   f"figure 1.88: {'met' if s['val_loss'] <= 1.88 else 'not met'}), "
                   f"{s['tokens_per_s']:,.0f} tokens/s.")
    if "throughput" in b:
        t = b["throughput"]
        ratios = ", ".join(f"{k}: **{v:.3f}**" for k, v in t["ratio"].items())
        out.append(f"- **throughput** ({t['rounds']} interleaved rounds of {t['chunk']} steps, ratios on "
                   f"{t['clock']}, {t['threads']} thread(s)): our loop / bare loop = {ratios} "
                   f"(targets 0.95 and 0.90).")
    if "cost" in b:
        c = b["cost"]
        rows = "\n".join(f"| {r['T']} | {r['proj_flops']:,} | {r['proj_formula']:,} | {r['attn_flops']:,} | "
                         f"{r['attn_formula']:,} | {r['attn_s'] / r['proj_s']:.2f} |" for r in c["rows"])
        out.append(f"- **cost** (d = {c['d']}; FLOPs = 2 x multiply-adds): counted equal to 8Td^2 and 4T^2d "
                   f"exactly: {c['exact']}; crossover predicted T = {c['predicted']}, counted "
                   f"T = {c['counted']}, timed T = {c['timed']}.\n\n"
                   "| T | projection FLOPs | 8Td^2 | attention FLOPs | 4T^2d | time attn / proj |\n"
                   f"|---|---|---|---|---|---|\n{rows}\n")
    if "memory" in b:
        m = b["memory"]
        lesson = "; ".join(f"T = {r['T']}: {_mib(r['per_layer'])} per layer, {_mib(r['12_layers'])} for 12 layers"
                           for r in m["lesson"])
        out.append(f"- **memory**: explicit path's saved weights == B h T^2 bytes exactly: {m['exact']}; "
                   f"SDPA saves no T x T tensor and grows linearly in T: {m['sdpa_linear']}. The lesson's case "
                   f"(B = 32, h = 8, fp16) by the verified formula: {lesson}.")
    return "\n".join(out) + "\n"
