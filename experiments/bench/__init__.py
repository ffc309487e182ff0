"""Benchmarks: every figure is printed by a run, ratios are measured side by side in one process.

    python -m experiments.bench shakespeare   # nanoGPT's CPU config on tiny Shakespeare: val loss, tokens/s
    python -m experiments.bench throughput    # our loop vs a bare loop, diagnostics off / default interval
    python -m experiments.bench cost          # FLOPs of projections vs attention, counted and timed
    python -m experiments.bench memory        # bytes saved for backward: explicit weights vs SDPA
Each takes --tiny (a seconds-long smoke size, used by the tests).
"""
import argparse
import datetime
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

from attention.diagnostics import saved_tensor_bytes
from experiments.config import compose
from experiments.io import write_json

NANOGPT = ["data=shakespeare_char", "model=nanogpt_cpu", "optim=nanogpt_cpu", "train=nanogpt_cpu",
           "logger=none", "train.progress=false"]
TINY_MODEL = ["model.n_layers=1", "model.d_model=32", "model.n_heads=2", "data.seq_len=16",
              "train.batch_size=4"]
MiB, GiB = 2 ** 20, 2 ** 30


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# -- shakespeare -------------------------------------------------------------------------------
def bench_shakespeare(tiny=False, overrides=(), reference=False) -> dict:
    """Train nanoGPT's published CPU config; val loss on train.eval_batches (200) val batches.
    reference: also train nanoGPT's own loop (transcribed) from the same seed, scored on the same
    val batches: if the two agree, a gap to the published figure is not our loop's."""
    from experiments.bench import nanogpt_reference
    from experiments.training.loop import Trainer
    over = NANOGPT + (TINY_MODEL + ["train.steps=20", "train.eval_batches=2"] if tiny else []) + list(overrides)
    cfg = compose(over)
    n_eval = cfg["train"]["eval_batches"]
    cfg["train"]["eval_batches"] = 0  # evaluated below, outside the timed loop
    with tempfile.TemporaryDirectory() as tmp:
        tr = Trainer(cfg, Path(tmp), ckpt_path=Path(tmp) / "ckpt.pt")
        task, bs = tr.task, cfg["train"]["batch_size"]
        print(f"shakespeare: {tr.res.params['total']:,} parameters, vocab {task.vocab_size}, "
              f"{cfg['train']['steps']} steps of {bs}x{task.input_len} chars "
              f"on {tr.device}, corpus {task.path}", flush=True)
        t0 = time.perf_counter()
        res = tr.run()
        sync(tr.device)
        wall = time.perf_counter() - t0
    val_batches = batch_losses(tr.model, task, bs, "val", range(n_eval), tr.amp)
    train = statistics.fmean(batch_losses(tr.model, task, bs, "train", range(10 ** 7, 10 ** 7 + n_eval), tr.amp))
    sample = task.decode(tr.model.generate(task.encode("\n").to(tr.device)[None], task.input_len - 1)[0].tolist())
    val = statistics.fmean(val_batches)
    # nanoGPT printed its 1.88 from eval_iters=20 batches: the same estimate on disjoint 20-batch
    # groups of our val batches shows how far one such estimate strays from the 200-batch mean
    est20 = [statistics.fmean(val_batches[i:i + 20]) for i in range(0, len(val_batches) - 19, 20)]
    tokens = res.steps_done * bs * task.input_len
    out = {"status": res.status, "steps": res.steps_done, "seed": cfg["seed"], "val_loss": val,
           "train_loss": train, "eval_batches": n_eval, "wall_s": wall, "tokens_per_s": tokens / wall,
           "val_loss_20": {"n": len(est20), "min": min(est20, default=val), "max": max(est20, default=val)}}
    print(f"val loss {val:.4f} (train {train:.4f}) on {n_eval} batches | {res.status} | "
          f"{wall:.1f}s training, {out['tokens_per_s']:,.0f} tokens/s")
    if est20:
        print(f"nanoGPT's 20-batch estimate (eval_iters=20) on {len(est20)} disjoint groups of these "
              f"batches: {min(est20):.4f} .. {max(est20):.4f}")
    if reference:
        ref = nanogpt_reference.train(task.splits["train"], task.vocab_size, cfg, tr.device)
        out["reference_val_loss"] = statistics.fmean(batch_losses(ref, task, bs, "val", range(n_eval), nullcontext))
        print(f"nanoGPT's own loop (experiments/nanogpt_reference.py), seed {cfg['seed']}, same val "
              f"batches: val loss {out['reference_val_loss']:.4f}")
    print(f"target (nanoGPT's published CPU figure): val loss <= 1.88: "
          f"{'met' if val <= 1.88 else 'NOT met'}")
    print("greedy sample:", repr(sample[:120]))
    return out


@torch.no_grad()
def batch_losses(model, task, batch_size: int, split: str, steps, amp) -> list[float]:
    """Mean loss of each batch `step` of `split` (train batches past the run's steps are unseen)."""
    from experiments.training.loop import mean_loss, token_losses
    model.eval()
    out = []
    for step in steps:
        b = task.batch(step, batch_size, split).to(next(model.parameters()).device)
        with amp():
            out.append(float(mean_loss(token_losses(model(b.x), b), b)))
    model.train()
    return out


# -- throughput --------------------------------------------------------------------------------
def bare_chunk(fwd, model, opt, sched, task, start, n, batch_size, clip, device, amp):
    """The loop as one would write it by hand: no diagnostics, no logging, no checks."""
    for step in range(start, start + n):
        b = task.batch(step, batch_size)
        x, y = b.x.to(device), b.y.to(device)
        with amp():
            logits = fwd(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()


def bench_throughput(tiny=False, rounds=None, chunk=None, overrides=()) -> dict:
    """Tokens/s of three loops on the same config, interleaved in rounds (order rotated each round
    so drift and other processes hit all three alike). Each round runs `chunk` steps per loop,
    ending on a multiple of diag_every, so the diagnostic steps per round are exactly the steady
    state's chunk / diag_every (and rounds x chunk = 400 steps hold two of the checkpoints
    written every 200). The ratio is total bare time / total time of ours, on CPU time when
    training on the CPU (a shared machine's other processes inflate wall time at random; CPU
    time counts what this process spent) and on wall time on a GPU."""
    from experiments.training.build import build_model, build_optimizer, lr_lambda
    from experiments.training.loop import Trainer
    over = NANOGPT + ["model.attention.backend=sdpa", "train.eval_batches=0"]
    over += (TINY_MODEL + ["train.diag_every=5", "train.ckpt_every=10"] if tiny else []) + list(overrides)
    cfg = compose(over)
    every = cfg["train"]["diag_every"] or 50
    chunk = chunk or every
    rounds = rounds or (2 if tiny else 8)
    if chunk % every:
        raise ValueError(f"--chunk={chunk} must be a multiple of train.diag_every={every}")
    tmp = tempfile.TemporaryDirectory()
    loops = {}
    for name, diag in (("ours, diagnostics off", 0), (f"ours, diagnostics every {every}", every)):
        c = {**cfg, "train": {**cfg["train"], "diag_every": diag}}
        loops[name] = Trainer(c, Path(tmp.name), ckpt_path=Path(tmp.name) / f"{diag}.pt")
    ref = loops["ours, diagnostics off"]
    task, device, bs, T = ref.task, ref.device, cfg["train"]["batch_size"], ref.task.input_len
    torch.manual_seed(cfg["seed"])
    model = build_model(cfg["model"], task).to(device)
    opt = build_optimizer(cfg["optim"], model, device)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg["optim"], cfg["train"]["steps"]))
    model.train()
    clip = cfg["train"]["grad_clip"]
    fwd = torch.compile(model) if cfg["train"]["compile"] else model  # as the Trainer does

    def run(name, start, n):
        if name == "bare":
            bare_chunk(fwd, model, opt, sched, task, start, n, bs, clip, device, ref.amp)
        else:  # the real loop, resumed in place: steps [start, start + n)
            tr = loops[name]
            tr.step, tr.tc["steps"] = start, start + n
            tr.run()
            tr.ckpt_path.unlink(missing_ok=True)  # checkpoints are written (and timed), never resumed
            if tr.res.status != "completed":
                raise RuntimeError(f"{name}: {tr.res.status} at step {tr.step}")
        sync(device)

    names = ["bare", *loops]
    for name in names:  # warm-up: step 0 (a diagnostic step in our loop) and allocator caches
        run(name, 0, 1)
        run(name, 1, every)
    wall, cpu = {n: [] for n in names}, {n: [] for n in names}
    start = every + 1
    for r in range(rounds):
        for name in names[r % 3:] + names[:r % 3]:
            w0, c0 = time.perf_counter(), time.process_time()
            run(name, start, chunk)
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)
        start += chunk
    tmp.cleanup()
    clock = "CPU time" if device.type == "cpu" else "wall time"
    times = cpu if device.type == "cpu" else wall
    tokens = chunk * bs * T * rounds
    out = {"chunk": chunk, "rounds": rounds, "diag_every": every, "device": str(device), "clock": clock,
           "d_model": cfg["model"]["d_model"], "n_heads": cfg["model"]["n_heads"], "seq_len": T, "batch_size": bs,
           "tokens_per_s": {n: tokens / sum(wall[n]) for n in names},
           "tokens_per_cpu_s": {n: tokens / sum(cpu[n]) for n in names}, "ratio": {}}
    print(f"throughput: {rounds} rounds x {chunk} steps of {bs}x{T} tokens per loop, interleaved, "
          f"on {device} ({torch.get_num_threads()} threads); SDPA backend; ratios on {clock}")
    print(f"  {'bare loop':<30} {out['tokens_per_s']['bare']:>8,.0f} tokens/s "
          f"{out['tokens_per_cpu_s']['bare']:>8,.0f} tokens/CPU-s")
    targets = {"ours, diagnostics off": 0.95, f"ours, diagnostics every {every}": 0.90}
    for name in loops:
        per_round = [b / o for b, o in zip(times["bare"], times[name])]
        ratio = sum(times["bare"]) / sum(times[name])
        out["ratio"][name] = ratio
        print(f"  {name:<30} {out['tokens_per_s'][name]:>8,.0f} tokens/s "
              f"{out['tokens_per_cpu_s'][name]:>8,.0f} tokens/CPU-s   ratio to bare {ratio:.3f} "
              f"(per round {min(per_round):.3f}..{max(per_round):.3f}, median "
              f"{statistics.median(per_round):.3f}; target >= {targets[name]:.2f}: "
              f"{'met' if ratio >= targets[name] else 'NOT met'})")
    if device.type == "cuda":
        out["mfu"] = mfu(model, out["tokens_per_s"]["bare"], T)
        print(f"  MFU (bare loop, 6N + 12 L T d FLOPs/token): {out['mfu']:.1%}")
    return out


PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}


def mfu(model, tokens_per_s: float, T: int) -> float:
    """PaLM's estimate: 6 N FLOPs per token for the weights + 12 L T d for attention."""
    c = model.cfg
    n = sum(p.numel() for p in model.parameters()) - model.pos_emb.weight.numel()
    flops = 6 * n + 12 * c.n_layers * T * c.d_model
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_BF16.items() if k in name), float("nan"))
    return flops * tokens_per_s / peak


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


BENCHES = {"shakespeare": bench_shakespeare, "throughput": bench_throughput,
           "cost": bench_cost, "memory": bench_memory}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m experiments.bench", description=__doc__.splitlines()[0])
    p.add_argument("name", choices=sorted(BENCHES))
    p.add_argument("--tiny", action="store_true", help="a seconds-long smoke size")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--out", type=Path, default=None,
                   help="also write the figures as JSON (results/bench/NAME.json feeds the report)")
    p.add_argument("--reference", action="store_true",
                   help="shakespeare: also train nanoGPT's own loop (transcribed) from the same seed")
    p.add_argument("overrides", nargs="*", help="Hydra overrides (shakespeare, throughput), e.g. device=cuda")
    a = p.parse_intermixed_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    kwargs = {"tiny": a.tiny}
    if a.overrides:
        if a.name not in ("shakespeare", "throughput"):
            p.error(f"{a.name} takes no config overrides")
        kwargs["overrides"] = a.overrides
    if a.reference:
        if a.name != "shakespeare":
            p.error("--reference is for shakespeare")
        kwargs["reference"] = True
    try:
        out = BENCHES[a.name](**kwargs)
        if a.out:
            write_json(a.out, {"bench": a.name, "date": datetime.date.today().isoformat(),
                               "threads": torch.get_num_threads(),
                               "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None, **out})
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
