"""Benchmarks of the training loop: nanoGPT's CPU recipe on tiny Shakespeare (val loss, tokens/s,
against nanoGPT's own loop), and our loop's throughput against a bare loop."""
import statistics
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

from experiments.config import compose

NANOGPT = ["data=shakespeare_char", "model=nanogpt_cpu", "optim=nanogpt_cpu", "train=nanogpt_cpu",
           "text_lm=none", "logger=none", "train.progress=false"]  # the presets, not the text model
TINY_MODEL = ["model.n_layers=1", "model.d_model=32", "model.n_heads=2", "data.seq_len=16",
              "train.batch_size=4"]


def checked(cfg: dict) -> dict:
    """The schema's check, as run.py's preflight does: `device=cuda` without a GPU, a bad value,
    is one line and exit 2 (experiments.bench.main), not a traceback."""
    from experiments.schema import validate
    validate(cfg)
    return cfg


def default_threads(cfg: dict) -> tuple[int, str]:
    """(threads, why): torch's threads as a run of this config sets them (train.threads, auto by
    default), or as `python -m experiments.bench --threads N` (train.threads=N) set them."""
    from experiments.training.runner import use_threads
    why = use_threads(cfg)
    return torch.get_num_threads(), why


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# -- shakespeare -------------------------------------------------------------------------------
def advance(tr, start: int, end: int) -> None:
    """Our real loop run over steps [start, end), resumed in place (its state in memory): the
    checkpoints it writes are written (and timed), never read back."""
    tr.step, tr.tc["steps"] = start, end
    tr.run()
    tr.ckpt_path.unlink(missing_ok=True)


def chunk_ends(steps: int, every: int) -> list[int]:
    """Where the interleaved loops hand over: after iteration k * every (a diagnostic step of ours
    when diag_every divides `every`, so cutting adds none) and at the end."""
    return sorted({min(steps, k * every + 1) for k in range(1, steps // every + 1)} | {steps})


def interleaved(loops: dict, steps: int, every: int, device) -> dict[str, float]:
    """Each loop (name -> advance(start, end)) run chunk by chunk, the order rotated each chunk so
    that the machine's drift hits them alike, each with its own global RNG state (nanoGPT's
    batches come from it), the one of the call's start. Returns each loop's wall seconds, summed
    over its chunks."""
    names, wall, start = list(loops), dict.fromkeys(loops, 0.0), 0
    states = dict.fromkeys(loops, torch.get_rng_state())
    for i, end in enumerate(chunk_ends(steps, every)):
        for name in names[i % len(names):] + names[:i % len(names)]:
            torch.set_rng_state(states[name])
            t0 = time.perf_counter()
            loops[name](start, end)
            sync(device)
            wall[name] += time.perf_counter() - t0
            states[name] = torch.get_rng_state()
        start = end
    return wall


def bench_shakespeare(tiny=False, overrides=(), reference=False) -> dict:
    """Train nanoGPT's published CPU config; val loss on train.eval_batches (200) val batches.
    reference: also train nanoGPT's own loop (transcribed) from the same seed, scored on the same
    val batches: if the two agree, a gap to the published figure is not our loop's. The two are
    timed side by side, interleaved in chunks of nanoGPT's eval interval (interleaved())."""
    from experiments.bench import nanogpt_reference
    from experiments.training.loop import Trainer
    over = NANOGPT + (TINY_MODEL + ["train.steps=20", "train.eval_batches=2"] if tiny else []) + list(overrides)
    cfg = checked(compose(over))
    threads, why = default_threads(cfg)
    n_eval, steps = cfg["train"]["eval_batches"], cfg["train"]["steps"]
    cfg["train"]["eval_batches"] = 0  # evaluated below, outside the timed loop
    with tempfile.TemporaryDirectory() as tmp:
        tr = Trainer(cfg, Path(tmp), ckpt_path=Path(tmp) / "ckpt.pt")
        task, bs = tr.task, cfg["train"]["batch_size"]
        print(f"shakespeare: {tr.res.params['total']:,} parameters, vocab {task.vocab_size}, "
              f"{steps} steps of {bs}x{task.input_len} chars "
              f"on {tr.device}, corpus {task.path}", flush=True)

        def ours(start, end):
            if tr.res.status == "completed":   # diverged: it stops there, as a run does
                advance(tr, start, end)
        loops = {"ours": ours}
        if reference:  # at the same threads: nanoGPT's train.py takes torch's default, all cores, as auto does on a quiet machine
            ref = nanogpt_reference.Loop({"train": task.splits["train"], "val": task.splits["val"]}, task.vocab_size,
                                         cfg, tr.device, tmp)   # seeded here: the RNG state interleaved() starts from
            loops["nanoGPT"] = lambda start, end: ref.advance(end - start)
        wall = interleaved(loops, steps, nanogpt_reference.EVAL_INTERVAL if reference else steps, tr.device)
    res = tr.res
    val_batches = batch_losses(tr.model, task, bs, "val", range(n_eval), tr.amp)
    train = statistics.fmean(batch_losses(tr.model, task, bs, "train", range(10 ** 7, 10 ** 7 + n_eval), tr.amp))
    sample = task.decode(tr.model.generate(task.encode("\n").to(tr.device)[None], task.input_len - 1)[0].tolist())
    val = statistics.fmean(val_batches)
    # nanoGPT printed its 1.88 from eval_iters=20 batches: the same estimate on disjoint 20-batch
    # groups of our val batches shows how far one such estimate strays from the 200-batch mean
    est20 = [statistics.fmean(val_batches[i:i + 20]) for i in range(0, len(val_batches) - 19, 20)]
    tokens = res.steps_done * bs * task.input_len
    out = {"status": res.status, "steps": res.steps_done, "seed": cfg["seed"], "val_loss": val,
           "train_loss": train, "eval_batches": n_eval, "wall_s": wall["ours"], "tokens_per_s": tokens / wall["ours"],
           "ms_per_iter": 1000 * wall["ours"] / max(res.steps_done, 1), "threads_ran": threads, "threads_why": why,
           "val_loss_20": {"n": len(est20), "min": min(est20, default=val), "max": max(est20, default=val)}}
    print(f"val loss {val:.4f} (train {train:.4f}) on {n_eval} batches | {res.status} | "
          f"{wall['ours']:.1f}s training, {out['tokens_per_s']:,.0f} tokens/s")
    if est20:
        print(f"nanoGPT's 20-batch estimate (eval_iters=20) on {len(est20)} disjoint groups of these "
              f"batches: {min(est20):.4f} .. {max(est20):.4f}")
    if reference:
        out["reference_ms_per_iter"] = 1000 * wall["nanoGPT"] / max(steps, 1)
        out["reference_val_loss"] = statistics.fmean(batch_losses(ref.model.eval(), task, bs, "val", range(n_eval),
                                                                  nullcontext))
        print(f"nanoGPT's own loop (experiments/nanogpt_reference.py, its estimate_loss every "
              f"{nanogpt_reference.EVAL_INTERVAL} iterations and its checkpoints included), seed {cfg['seed']}, same "
              f"val batches: val loss {out['reference_val_loss']:.4f}; {out['reference_ms_per_iter']:.1f} ms/iter "
              f"against ours {out['ms_per_iter']:.1f} (ratio {out['ms_per_iter'] / out['reference_ms_per_iter']:.2f}; "
              f"interleaved in chunks of {nanogpt_reference.EVAL_INTERVAL})")
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
    over = NANOGPT + ["model.attention.backend=sdpa"]
    over += (TINY_MODEL + ["train.diag_every=5", "train.ckpt_every=10"] if tiny else []) + list(overrides)
    cfg = checked(compose(over))
    cfg["train"]["eval_batches"] = 0  # nothing is evaluated: only the loops are timed
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
        else:
            tr = loops[name]
            advance(tr, start, start + n)
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
