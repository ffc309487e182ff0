"""Heads, d_v != d_k and shared keys/values (`-m +exp=heads`, `dv_ne_dk`, `kv_sharing`).

The heads table has the shape of Vaswani et al. 2017 Table 3 row (A) with their dev PPL beside
ours (exp of the answer loss); the statements under it (does one head fail by interference, does
it split its weight 50/50, does the smallest d_k hurt against the middle of the range) are
computed here from the runs, one per condition (task knobs, layers, width, budget).
"""
import math
import statistics
import textwrap
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.facts import about_even  # noqa: E402
from experiments.records import RunRecord  # noqa: E402

NAME = "heads"
# Vaswani et al. 2017, Table 3 row (A): dev perplexity (per wordpiece) at constant compute, d_model 512
VASWANI_PPL = {1: 5.29, 4: 5.00, 8: 4.92, 16: 4.91, 32: 5.01}
SOLVED_MARGIN = 0.2   # "several heads solve it": best h >= 2 accuracy this far above the average's ceiling
LIMITED_MARGIN = 0.05  # "one head is limited to the average": h = 1 accuracy at most this above it


def _ms(xs: list) -> str:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return "–"
    if len(xs) == 1:
        return f"{xs[0]:.3g}"
    return f"{statistics.mean(xs):.3g} ± {statistics.stdev(xs):.2g}"


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.mean(xs) if xs else None


def condition(cfg: dict) -> tuple:
    d, m = cfg["data"], cfg["model"]
    return (("copies", d.get("max_copies")), ("ordered", d.get("ordered")), ("shared", d.get("shared_values")),
            ("K", d.get("n_values")), ("layers", m["n_layers"]), ("d_model", m["d_model"]),
            ("steps", cfg["train"]["steps"]))


def describe(cond: tuple) -> str:
    c = dict(cond)
    return (f"d_model={c['d_model']}, {c['layers']} layer(s), {c['steps']} steps; two_facts K={c['K']}, "
            f"max_copies={c['copies']}, {'ordered' if c['ordered'] else 'unordered'} answer, "
            f"{'one shared' if c['shared'] else 'separate'} value set(s)")


def heads_table(runs: list[RunRecord]) -> tuple[str, dict]:
    by_h = defaultdict(list)
    for r in runs:
        by_h[r.config["model"]["n_heads"]].append(r.final)
    d = runs[0].config["model"]["d_model"]
    lines = ["| h | d_k | attention params | acc/answer | loss/answer | PPL (ours) | PPL (Vaswani (A)) "
             "| weight on a | weight on b | mixing heads | a, b in separate heads | loss/train | seeds |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    stats = {}
    for h in sorted(by_h):
        f = by_h[h]
        col = lambda k: [x.get(k) for x in f]  # noqa: E731
        ppl = [math.exp(x) for x in col("loss/answer") if x is not None]
        stats[h] = {"acc": _mean(col("acc/answer")), "loss": _mean(col("loss/answer")),
                    "fa": _mean(col("attn/fact_a")), "fb": _mean(col("attn/fact_b")),
                    "split": _mean(col("attn/split")), "accs": col("acc/answer"),
                    "ceiling": f[0].get("acc/average_ceiling"), "params": sorted(set(col("params/attention")))}
        lines.append(f"| {h} | {d // h} | {', '.join(map(str, stats[h]['params']))} | {_ms(col('acc/answer'))} "
                     f"| {_ms(col('loss/answer'))} | {_ms(ppl)} | {VASWANI_PPL.get(h, '–')} "
                     f"| {_ms(col('attn/fact_a'))} | {_ms(col('attn/fact_b'))} | {_ms(col('attn/split'))} "
                     f"| {_ms(col('attn/separated'))} | {_ms(col('loss/train'))} | {len(f)} |")
    return "\n".join(lines), stats


def statements(stats: dict, d_model: int, layers: int = 1) -> list[str]:
    out = []
    params = {p for s in stats.values() for p in s["params"]}
    out.append(f"Attention parameters are {'identical' if len(params) == 1 else 'NOT identical'} across h "
               f"({', '.join(map(str, sorted(params)))}; layers x (4 d_model^2 + 4 d_model) = "
               f"{layers * (4 * d_model ** 2 + 4 * d_model)}).")
    one, multi = stats.get(1), {h: s for h, s in stats.items() if h >= 2}
    if one and multi and one["ceiling"] is not None:
        ceil = one["ceiling"]
        best_h = max(multi, key=lambda h: multi[h]["acc"])
        limited = one["acc"] <= ceil + LIMITED_MARGIN
        solved = multi[best_h]["acc"] >= ceil + SOLVED_MARGIN
        what = ("**one head fails by interference**: its accuracy stays within "
                f"{LIMITED_MARGIN} of what an equal-weight average allows while h={best_h} clears it"
                if limited and solved else
                "**one head does not fail by interference here**: it beats the equal-weight average's "
                "ceiling (it weights the facts unequally)" if not limited else
                "neither one head nor several clear the average's ceiling (undertrained)")
        out.append(f"h=1: acc/answer {one['acc']:.3g} (loss {one['loss']:.3g}) against the ceiling of an "
                   f"equal-weight average {ceil:.3g}; best h={best_h}: {multi[best_h]['acc']:.3g} "
                   f"(loss {multi[best_h]['loss']:.3g}). Verdict: {what}.")
    elif one and one["ceiling"] is not None and one["ceiling"] >= 1:
        out.append(f"h=1 only: acc/answer {one['acc']:.3g}; here an equal-weight average determines the answer "
                   f"(ceiling 1), so there is no interference to fail by.")
    elif one and one["ceiling"] is not None:
        beats = one["acc"] > one["ceiling"] + LIMITED_MARGIN
        out.append(f"h=1 only: acc/answer {one['acc']:.3g} against the equal-weight average's ceiling "
                   f"{one['ceiling']:.3g}: one head {'is not' if beats else 'is'} limited to the average here.")
    if one and one["fa"] is not None:
        even = about_even(one["fa"], one["fb"])
        out.append(f"One head's split: {one['fa']:.2f} on a, {one['fb']:.2f} on b "
                   f"({'about 50/50' if even else 'not 50/50'}); "
                   f"{one['split']:.0%} of its fact-reading rows mix both facts.")
    hs = sorted(stats)
    if len(hs) >= 4:
        small = hs[-1]
        middle = hs[len(hs) // 2 - 1: len(hs) // 2 + 1]
        mid_loss = _mean([stats[h]["loss"] for h in middle])
        worse = stats[small]["loss"] - mid_loss
        out.append(f"Smallest d_k ({d_model // small}, h={small}): loss/answer {stats[small]['loss']:.3g} against "
                   f"{mid_loss:.3g} for the middle of the range (h={', '.join(map(str, middle))}, d_k="
                   f"{', '.join(str(d_model // h) for h in middle)}): "
                   f"{'it hurts' if worse > 0.05 else 'no measurable harm'} ({worse:+.3g}).")
    return out


def heads_figure(stats: dict, label: str, path: Path):
    hs = sorted(stats)
    fig, ax = plt.subplots(figsize=(6.4, 3.6), layout="constrained")
    ax.plot(hs, [stats[h]["acc"] for h in hs], "o-", label="mean over seeds")
    for i, h in enumerate(hs):
        ax.plot([h] * len(stats[h]["accs"]), stats[h]["accs"], ".", color="gray", alpha=0.6,
                label="one seed" if i == 0 else None)
    if stats[hs[0]]["ceiling"]:
        ax.axhline(stats[hs[0]]["ceiling"], ls="--", color="r", label="ceiling of an\nequal-weight average")
    ax.set_xscale("log", base=2)
    ax.set_xticks(hs, [str(h) for h in hs])
    ax.minorticks_off()
    ax.set_xlabel("heads h (d_k = d_model / h; same parameter count)")
    ax.set_ylabel("answer accuracy (fraction correct)")
    ax.set_ylim(0, 1.02)
    ax.set_title(textwrap.fill(label, 70), fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pairs(runs: list[RunRecord], exp: str) -> list[tuple]:
    """(config, final, seed, is_control) of each completed run of exp and of its control, controls once."""
    rows, seen = [], set()
    for r in runs:
        if r.exp != exp or r.status != "completed":
            continue
        rows.append((r.config, r.final, r.seed, False))
        c = r.control
        if c and c.get("status") == "completed" and c["config_hash"] not in seen:
            seen.add(c["config_hash"])
            rows.append((None, c["final"], r.seed, True))
    return rows


def dv_table(runs: list[RunRecord]) -> str | None:
    rows = _pairs(runs, "dv_ne_dk")
    if not rows:
        return None
    ctrl = defaultdict(list)
    for _, f, seed, is_c in rows:
        if is_c:
            ctrl[seed].append(f.get("loss/copy"))
    by = defaultdict(list)
    for _, f, seed, is_c in rows:
        w = f.get("attn/merged_width")
        key = (w, "d_v = d_k (control)" if is_c else "")
        delta = None if is_c or not ctrl.get(seed) else f.get("loss/copy") - ctrl[seed][0]
        by[key].append((f, delta))
    out = ["| h d_v (W_o input, measured) | formula | attention params | formula | loss/copy | vs d_v = d_k | seeds |",
           "|---|---|---|---|---|---|---|"]
    for (w, tag), fs in sorted(by.items(), key=lambda kv: kv[0][0] or 0):
        f0 = fs[0][0]
        out.append(f"| {w}{' ' + tag if tag else ''} | {f0.get('attn/merged_width_formula')} "
                   f"| {f0.get('params/attention')} | {f0.get('params/attention_formula')} "
                   f"| {_ms([f.get('loss/copy') for f, _ in fs])} | {_ms([d for _, d in fs])} | {len(fs)} |")
    return "\n".join(out)


def kv_table(runs: list[RunRecord]) -> str | None:
    rows = _pairs(runs, "kv_sharing")
    if not rows:
        return None
    ctrl = {seed: f.get("loss/copy") for _, f, seed, is_c in rows if is_c}
    by = defaultdict(list)
    for _, f, seed, is_c in rows:
        delta = None if is_c or seed not in ctrl else f.get("loss/copy") - ctrl[seed]
        by[(f.get("kv/mha_over_this"), is_c)].append((f, delta))
    out = ["| cache vs MHA (measured) | predicted n_heads / n_kv_heads | KV bytes (cache tensors) | formula "
           "| context T | decode ms/token | decode time vs MHA twin | loss/copy | vs MHA | seeds |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for (ratio, is_c), fs in sorted(by.items(), key=lambda kv: kv[0][0] or 0):
        f0 = fs[0][0]
        out.append(f"| 1/{ratio:g}{' (MHA control)' if is_c else ''} | {f0.get('kv/mha_over_this_predicted'):g} "
                   f"| {f0.get('kv/bytes')} | {f0.get('kv/bytes_formula')} | {f0.get('kv/context')} "
                   f"| {_ms([f.get('decode/ms_per_token') for f, _ in fs])} "
                   f"| {_ms([f.get('decode/time_vs_mha') for f, _ in fs])} "
                   f"| {_ms([f.get('loss/copy') for f, _ in fs])} | {_ms([d for _, d in fs])} | {len(fs)} |")
    return "\n".join(out)


def render(runs: list[RunRecord], fig_dir: Path) -> str | None:
    heads = [r for r in runs if r.exp == "heads" and r.status == "completed"]
    parts = []
    by_cond = defaultdict(list)
    for r in heads:
        by_cond[condition(r.config)].append(r)
    if by_cond:
        parts.append("## Heads: one softmax against several\n")
    for i, (cond, runs) in enumerate(sorted(by_cond.items(), key=lambda kv: -len(kv[1]))):
        table, stats = heads_table(runs)
        parts.append(f"**{describe(cond)}**\n\n{table}\n")
        parts.extend(f"- {line}" for line in statements(stats, dict(cond)["d_model"], dict(cond)["layers"]))
        if len(stats) >= 3:
            fig_dir.mkdir(parents=True, exist_ok=True)
            file = f"heads_{i}.png"
            heads_figure(stats, describe(cond), fig_dir / file)
            parts.append(f"\n![answer accuracy against h](figures/{file})\n\n"
                         "*Look at: the h = 1 point against the dashed ceiling (a head that can only average "
                         "the two facts sits on it) and whether h >= 2, at the same parameter count, "
                         "clears it.*\n")
        parts.append("")
    dv = dv_table(runs)
    if dv:
        parts.append("## d_v != d_k\n\n" + dv + "\n")
    kv = kv_table(runs)
    if kv:
        parts.append("## Shared keys and values (GQA / MQA)\n\n" + kv + "\n")
    return "\n".join(parts) if parts else None
