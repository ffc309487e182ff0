"""Benchmarks of one attention layer: FLOPs of the projections against attention (counted and
timed), and the bytes saved for backward by the explicit path against SDPA."""
import statistics
import time

import torch

from attention.diagnostics import saved_tensor_bytes

MiB, GiB = 2 ** 20, 2 ** 30


# -- cost --------------------------------------------------------------------------------------
def _median_time(fn, reps) -> tuple[float, float]:
    """Median (wall, CPU) seconds of fn() after one warm-up call."""
    fn()
    wall, cpu = [], []
    for _ in range(reps):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


@torch.no_grad()
def bench_cost(tiny=False, d=None, lengths=None, reps=None) -> dict:
    """FLOPs of the four projections and of attention itself, counted by FlopCounterMode on the
    explicit path (it counts matmuls: 2 FLOPs per multiply-add; softmax is not counted), against
    4 T d^2 and 2 T^2 d multiply-adds; plus forward wall time of each. Batch 1, h = 8."""
    from torch.utils.flop_counter import FlopCounterMode

    from attention import MultiHeadAttention
    d = d or (64 if tiny else 512)
    lengths = lengths or ([32, 64, 128, 256] if tiny else [128 * 2 ** i for i in range(6)])
    reps = reps or (1 if tiny else 3)
    m = MultiHeadAttention(d_model=d, n_heads=8, backend="explicit", bias=False).eval()
    print(f"cost: d = {d}, h = 8, batch 1; FLOPs = 2 x multiply-adds (FlopCounterMode's convention)")
    print(f"{'T':>6} {'proj FLOPs':>14} {'8 T d^2':>14} {'attn FLOPs':>14} {'4 T^2 d':>14} "
          f"{'proj ms':>8} {'attn ms':>8} {'ratio':>6} {'proj CPU':>9} {'attn CPU':>9} {'ratio':>6}")
    rows = []
    for T in lengths:
        x = torch.randn(1, T, d)
        with FlopCounterMode(display=False) as fc:
            m(x, x, x)
        counts = fc.get_flop_counts()
        proj = sum(sum(counts[f"MultiHeadAttention.{w}"].values()) for w in ("W_q", "W_k", "W_v", "W_o"))
        attn = fc.get_total_flops() - proj
        q = m.split_heads(m.W_q(x), 8, m.d_k)
        k, v = m.split_heads(m.W_k(x), 8, m.d_k), m.split_heads(m.W_v(x), 8, m.d_k)
        ctx = m.attend(q, k, v)[0].transpose(1, 2).reshape(1, T, d)
        t_proj = _median_time(lambda: (m.W_q(x), m.W_k(x), m.W_v(x), m.W_o(ctx)), reps)
        t_attn = _median_time(lambda: m.attend(q, k, v), reps)
        row = {"T": T, "proj_flops": proj, "proj_formula": 2 * 4 * T * d * d, "attn_flops": attn,
               "attn_formula": 2 * 2 * T * T * d, "proj_s": t_proj[0], "attn_s": t_attn[0],
               "proj_cpu_s": t_proj[1], "attn_cpu_s": t_attn[1]}
        rows.append(row)
        print(f"{T:>6} {proj:>14,} {row['proj_formula']:>14,} {attn:>14,} {row['attn_formula']:>14,} "
              f"{1e3 * t_proj[0]:>8.2f} {1e3 * t_attn[0]:>8.2f} {t_attn[0] / t_proj[0]:>6.2f} "
              f"{1e3 * t_proj[1]:>9.2f} {1e3 * t_attn[1]:>9.2f} {t_attn[1] / t_proj[1]:>6.2f}", flush=True)
    exact = all(r["proj_flops"] == r["proj_formula"] and r["attn_flops"] == r["attn_formula"] for r in rows)
    counted = next((r["T"] for r in rows if r["attn_flops"] >= r["proj_flops"]), None)
    timed = next((r["T"] for r in rows if r["attn_s"] >= r["proj_s"]), None)
    timed_cpu = next((r["T"] for r in rows if r["attn_cpu_s"] >= r["proj_cpu_s"]), None)
    print(f"counted FLOPs equal the formulas exactly: {exact}")
    print(f"crossover (attention >= projections): predicted T = 2d = {2 * d}; counted T = {counted}; "
          f"timed: first T of the grid = {timed} (wall), {timed_cpu} (CPU time); time also pays for "
          f"the softmax and the T x T memory traffic, which FLOPs ignore")
    return {"d": d, "rows": rows, "exact": exact, "predicted": 2 * d, "counted": counted,
            "timed": timed, "timed_cpu": timed_cpu}


# -- memory ------------------------------------------------------------------------------------
def human(n: int) -> str:
    return f"{n / GiB:,.0f} GiB" if n >= GiB else f"{n / MiB:,.0f} MiB"


def saved_bytes(module, x) -> dict:
    """Bytes the forward saves for backward, by distinct storage, parameters excluded;
    `square`: those of (..., T, T) tensors, the attention weights."""
    (out, _), saved = saved_tensor_bytes(lambda: module(x, x, x, is_causal=True), module.parameters(), T=x.shape[1])
    out.float().sum().backward()  # the saved tensors really are what backward needs
    return saved


def bench_memory(tiny=False, batch=None, heads=8, lengths=None) -> dict:
    """Measured at sizes that fit; the lesson's case extrapolated by the formula verified here."""
    from attention import MultiHeadAttention
    from attention.diagnostics import attention_matrix_bytes
    batch = batch or (4 if tiny else 32)
    lengths = lengths or ([16, 32, 64] if tiny else [64, 128, 256, 512])
    d = heads * 8  # d_k = 8: the weights' size does not depend on d, the compute does
    print(f"memory: bytes saved for backward by one attention layer, B = {batch}, h = {heads}, "
          f"d_model = {d}, causal self-attention")
    print(f"{'dtype':>8} {'T':>5} {'explicit: weights':>18} {'B h T^2 bytes':>14} {'explicit total':>15} "
          f"{'SDPA total':>12} {'SDPA bytes/T':>13}")
    rows = []
    for dtype in (torch.float16, torch.float32):
        nb = torch.finfo(dtype).bits // 8
        for T in lengths:
            torch.manual_seed(0)
            x = torch.randn(batch, T, d, dtype=dtype, requires_grad=True)
            r = {"dtype": str(dtype).split(".")[-1], "T": T, "formula": attention_matrix_bytes(batch, heads, T, nb)}
            for backend in ("explicit", "sdpa"):
                m = MultiHeadAttention(d_model=d, n_heads=heads, backend=backend, bias=False).to(dtype)
                s = saved_bytes(m, x)
                r[backend], r[f"{backend}_square"] = s["total"], s["square"]
            rows.append(r)
            print(f"{r['dtype']:>8} {T:>5} {r['explicit_square']:>18,} {r['formula']:>14,} "
                  f"{r['explicit']:>15,} {r['sdpa']:>12,} {r['sdpa'] / T:>13,.0f}", flush=True)
    exact = all(r["explicit_square"] == r["formula"] for r in rows)
    sdpa_linear = all(r["sdpa_square"] == 0 for r in rows) and all(
        a["sdpa"] * b["T"] == b["sdpa"] * a["T"] for a, b in zip(rows, rows[1:]) if a["dtype"] == b["dtype"])
    print(f"explicit weights measured == B*h*T^2*bytes exactly: {exact}; "
          f"SDPA saves no T x T tensor and its bytes are linear in T: {sdpa_linear}")
    lesson = []
    for T in (1024, 2048):
        per_layer = attention_matrix_bytes(32, 8, T, 2)
        lesson.append({"T": T, "per_layer": per_layer, "12_layers": 12 * per_layer})
        print(f"lesson (B=32, h=8, fp16, extrapolated by the verified formula): T = {T}: "
              f"{human(per_layer)} per layer, {human(12 * per_layer)} for 12 layers")
    out = {"rows": rows, "exact": exact, "sdpa_linear": sdpa_linear, "lesson": lesson}
    if torch.cuda.is_available() and not tiny:
        out["cuda_peak"] = cuda_peak_memory()
    return out


def cuda_peak_memory(batch=32, heads=8, d=512, lengths=(1024, 2048), dtype=torch.bfloat16) -> list:
    """On a GPU: peak memory of one layer's forward + backward at the lesson's size, per backend."""
    from attention import MultiHeadAttention
    rows = []
    for T in lengths:
        for backend in ("explicit", "sdpa"):
            m = MultiHeadAttention(d_model=d, n_heads=heads, backend=backend, bias=False).cuda().to(dtype)
            x = torch.randn(batch, T, d, device="cuda", dtype=dtype, requires_grad=True)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            m(x, x, x, is_causal=True)[0].float().sum().backward()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
            rows.append({"T": T, "backend": backend, "peak": peak})
            print(f"{torch.cuda.get_device_name()}: B={batch} h={heads} d={d} T={T} {dtype}: "
                  f"{backend} peak {peak / MiB:,.0f} MiB above inputs (one layer, forward + backward)")
            del m, x
            torch.cuda.empty_cache()
    return rows
