"""The training loop: device, optimizer, diagnostics on chosen steps, NaN/inf detection,
checkpoint + resume. Knows nothing of experiments or verdicts."""
import math
import os
import random
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from attention import ModelConfig, TransformerLM
from attention.diagnostics import Recorder
from data import Batch, Task, build_task
from data.synthetic import IGNORE
from experiments.io import save_torch, write_rows_csv


@dataclass
class RunResult:
    status: str = "completed"          # completed | diverged | error | preempted
    rows: list = field(default_factory=list)       # metrics.csv: one dict per logged step
    perf: list = field(default_factory=list)       # wall-clock figures, kept out of metrics.csv
    final: dict = field(default_factory=dict)      # eval metrics at the end
    nonfinite: dict | None = None      # {step, module, where}
    attn_weights: dict = field(default_factory=dict)  # step -> {layer: (h, T, T)} of example 0
    params: dict = field(default_factory=dict)
    steps_done: int = 0


def pick_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device=cuda but no CUDA device is available")
    return torch.device(name)


def autocast_dtype(name: str, device: torch.device):
    """auto: bf16 on CUDA, none elsewhere. float16 on CPU is honoured: exp overflows above ~11.09."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def build_model(model_cfg: dict, task: Task) -> TransformerLM:
    d = dict(model_cfg)
    d["vocab_size"] = task.vocab_size
    if task.input_len > d.get("block_size", task.input_len):
        raise ValueError(f"sequence length {task.input_len} exceeds model.block_size={d['block_size']}")
    return TransformerLM(ModelConfig.from_dict(d))


def build_optimizer(optim_cfg: dict, model, device):
    name, lr = optim_cfg["name"], float(optim_cfg["lr"])
    if not lr > 0:
        raise ValueError(f"optim.lr={lr} must be positive")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": optim_cfg.get("weight_decay", 0.0)},
              {"params": no_decay, "weight_decay": 0.0}]
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(optim_cfg.get("betas", (0.9, 0.999))),
                                 eps=optim_cfg.get("eps", 1e-8), fused=device.type == "cuda")
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=optim_cfg.get("momentum", 0.0))
    raise ValueError(f"optim.name={name!r} is not one of adamw, sgd")


def lr_lambda(optim_cfg: dict, steps: int):
    """Linear warmup, then constant or cosine down to min_lr (nanoGPT's schedule)."""
    warmup = optim_cfg.get("warmup_steps", 0)
    decay_steps = optim_cfg.get("decay_steps") or steps
    floor = optim_cfg.get("min_lr", 0.0) / optim_cfg["lr"]
    schedule = optim_cfg.get("schedule", "constant")

    def f(step):
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if schedule == "constant":
            return 1.0
        t = min(1.0, (step - warmup) / max(1, decay_steps - warmup))
        return floor + 0.5 * (1 + math.cos(math.pi * t)) * (1 - floor)
    return f


def token_losses(logits, batch: Batch):
    """Per-token cross-entropy (B, T); IGNORE targets give 0."""
    # (B*T, V) rows, not (B, V, T): the 2-D kernel is the faster one, forward and backward
    return F.cross_entropy(logits.float().flatten(0, 1), batch.y.flatten(), ignore_index=IGNORE,
                           reduction="none").view(batch.y.shape)


def mean_loss(per_tok, batch: Batch):
    valid = batch.y != IGNORE
    return (per_tok * valid).sum() / valid.sum().clamp_min(1)


@torch.no_grad()
def group_metrics(per_tok, logits, batch: Batch) -> dict[str, torch.Tensor]:
    out = {}
    valid = batch.y != IGNORE
    for name, g in batch.groups.items():
        g = g & valid
        n = g.sum().clamp_min(1)
        out[f"loss/{name}"] = (per_tok * g).sum() / n
        out[f"acc/{name}"] = ((logits.argmax(-1) == batch.y) & g).sum() / n
    return out


def first_nonfinite_module(model, batch: Batch, amp) -> str | None:
    """Rerun the forward with hooks; the first module (in execution order) whose output is
    not finite is where the overflow happened."""
    found = []

    def hook(name):
        def f(mod, inp, out):
            t = out[0] if isinstance(out, tuple) else out
            if not found and torch.is_tensor(t) and not torch.isfinite(t).all():
                found.append(name)
        return f
    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n]
    # the softmax inside attention is not a module: wrap the explicit path to check its weights
    probes = []
    for a in model.attentions:
        orig = a._explicit

        def probe(q, k, v, mask, a=a, orig=orig):
            out, w = orig(q, k, v, mask)
            if not found and not torch.isfinite(w).all():
                found.append(f"blocks.{a.layer_idx}.attn.softmax[{a.cfg.softmax}]")
            return out, w
        a._explicit = probe
        probes.append((a, orig))
    try:
        with torch.no_grad(), amp():  # a recorder forces the explicit path: SDPA hides the weights
            for a in model.attentions:
                a.recorder = Recorder()
            model(batch.x, key_padding_mask=batch.key_padding_mask)
    finally:
        for h in handles:
            h.remove()
        for a, orig in probes:
            a._explicit = orig
            a.recorder = None
    return found[0] if found else None


class Preempted(Exception):
    """SIGTERM arrived: a checkpoint was written, the job should exit and be requeued."""


def preempt_signals() -> list[int]:
    """SIGTERM (a cluster or a user stopping the job) and submitit's preemption/timeout signal
    (USR2 unless SUBMITIT_PREEMPT_SIGNAL says otherwise)."""
    usr = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), signal.SIGUSR2)
    return list(dict.fromkeys([signal.SIGTERM, usr]))


class Trainer:
    def __init__(self, cfg, run_dir: Path, ckpt_path: Path | None = None, log_fn=None, progress=None):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.tc = cfg["train"]
        self.device = pick_device(cfg["device"])
        self.amp_dtype = autocast_dtype(self.tc.get("dtype", "auto"), self.device)
        torch.manual_seed(cfg["seed"])
        random.seed(cfg["seed"])
        self.task = build_task(cfg["data"], seed=cfg["seed"])
        self.model = build_model(cfg["model"], self.task).to(self.device)
        self.optim = build_optimizer(cfg["optim"], self.model, self.device)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.optim, lr_lambda(cfg["optim"], self.tc["steps"]))
        self.forward = torch.compile(self.model) if self.tc.get("compile") else self.model
        self.ckpt_path = ckpt_path
        self.log_fn = log_fn or (lambda metrics, step, attn=None: None)
        self.progress = progress
        self.res = RunResult(params=self.model.param_count())
        self.step = 0
        self._chunked_upto = 0  # rows and weights of steps before this are in checkpoint chunks
        self._stop = False

    def amp(self):
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    # -- checkpoints -------------------------------------------------------------------------
    # ckpt.pt holds what resuming needs and is the same size at every step. What grows with the
    # step count (the logged rows, the recorded attention weights) goes beside it, one chunk per
    # checkpoint holding only what was logged since the previous one: nothing is rewritten.
    def state(self) -> dict:
        return {"model": self.model.state_dict(), "optim": self.optim.state_dict(),
                "sched": self.sched.state_dict(), "step": self.step,
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}}

    def save_checkpoint(self):
        if self.ckpt_path is None:
            return
        since = self._chunked_upto
        rows = [r for r in self.res.rows if since <= r["step"] < self.step]
        weights = {s: w for s, w in self.res.attn_weights.items() if since <= s < self.step}
        # the chunk first: a kill between the two leaves a chunk newer than ckpt.pt, ignored on resume
        save_torch(chunk_path(self.ckpt_path, self.step), {"rows": rows, "attn_weights": weights})
        save_torch(self.ckpt_path, self.state())
        self._chunked_upto = self.step

    def try_resume(self) -> bool:
        if self.ckpt_path is None or not self.ckpt_path.exists():
            return False
        s = torch.load(self.ckpt_path, map_location=self.device, weights_only=False)
        self.model.load_state_dict(s["model"])
        self.optim.load_state_dict(s["optim"])
        self.sched.load_state_dict(s["sched"])
        self.step = self._chunked_upto = s["step"]
        self.res.rows, self.res.attn_weights = [], {}
        for p in chunks(self.ckpt_path, upto=self.step):
            c = torch.load(p, weights_only=False)
            self.res.rows += c["rows"]
            self.res.attn_weights.update(c["attn_weights"])
        torch.set_rng_state(s["rng"]["torch"])
        random.setstate(s["rng"]["python"])
        if s["rng"]["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(s["rng"]["cuda"])
        return True

    # -- one step ------------------------------------------------------------------------------
    def _set_recorders(self, rec):
        for a in self.model.attentions:
            a.recorder = rec

    def train_step(self, batch: Batch, log: bool, diag: bool):
        rec = Recorder(keep_weights=True) if diag else None
        self._set_recorders(rec)
        model = self.model if diag else self.forward  # diagnostics run eagerly, on the explicit path
        with self.amp():
            logits = model(batch.x, key_padding_mask=batch.key_padding_mask)
        per_tok = token_losses(logits, batch)
        loss = mean_loss(per_tok, batch)
        self.optim.zero_grad(set_to_none=True)
        loss.backward()
        clip = self.tc.get("grad_clip") or 0.0
        if clip > 0:
            gnorm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        elif log:
            gnorm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), float("inf"))
        else:
            gnorm = None
        metrics = None
        if log or diag:
            metrics = {"loss/train": loss.detach(), "lr": self.sched.get_last_lr()[0]}
            metrics.update(group_metrics(per_tok.detach(), logits.detach(), batch))
            if gnorm is not None:
                metrics["grad/norm"] = gnorm
        if diag:
            metrics.update(rec.collect_grads())
            for a in self.model.attentions:
                metrics[f"grad/W_q/{a.name}"] = a.W_q.weight.grad.norm()
                metrics[f"grad/W_k/{a.name}"] = a.W_k.weight.grad.norm()
            self.res.attn_weights[self.step] = dict(rec.weights)
            self._set_recorders(None)
        return loss, gnorm, metrics

    def check_finite(self, loss, gnorm, batch) -> bool:
        # one host sync per step (not two): gnorm >= 0, so the sum is finite iff both are
        bad = not bool(torch.isfinite(loss.detach() if gnorm is None else loss.detach() + gnorm))
        if bad:
            where = "forward" if not torch.isfinite(loss) else "backward"
            module = first_nonfinite_module(self.model, batch, self.amp)
            if module is None:  # the forward is finite: name the first parameter whose gradient is not
                module = next((n for n, p in self.model.named_parameters()
                               if p.grad is not None and not torch.isfinite(p.grad).all()), None)
            self.res.nonfinite = {"step": self.step, "module": module, "where": where}
        return not bad

    @torch.no_grad()
    def evaluate(self, n_batches: int, split: str = "val") -> dict:
        self.model.eval()
        sums: dict[str, float] = {}
        for i in range(n_batches):
            b = self.task.batch(i, self.tc["batch_size"], split).to(self.device)
            with self.amp():
                logits = self.model(b.x, key_padding_mask=b.key_padding_mask)
            per_tok = token_losses(logits, b)
            m = {"loss/train": mean_loss(per_tok, b), **group_metrics(per_tok, logits, b)}
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + float(v) / n_batches
        self.model.train()
        return sums

    # -- the loop ------------------------------------------------------------------------------
    def _on_preempt(self, signum, frame):
        self._stop = signum  # acted on at the next step boundary, where the state is consistent

    def _preempt(self, old_handlers: dict):
        """Checkpoint, then exit: submitit's own handler (if it installed one for this signal)
        requeues the job, whose rerun resumes here; otherwise Preempted ends the run."""
        self.save_checkpoint()
        signum, old = self._stop, old_handlers.get(self._stop)
        for s, h in old_handlers.items():
            signal.signal(s, h)
        old_handlers.clear()
        if signum != signal.SIGTERM and callable(old):
            old(signum, None)  # submitit: dumps the requeue pickle and exits
        raise Preempted(f"signal {signal.Signals(signum).name} at step {self.step}; "
                        f"checkpoint written to {self.ckpt_path}")

    def run(self) -> RunResult:
        tc = self.tc
        steps, log_every = tc["steps"], tc["log_every"]
        diag_every, ckpt_every = tc.get("diag_every", 0), tc.get("ckpt_every", 0)
        self.try_resume()
        old = {s: signal.signal(s, self._on_preempt) for s in preempt_signals()} if _main_thread() else {}
        tokens = tc["batch_size"] * self.task.input_len
        t_last, n_last = time.perf_counter(), self.step
        self.model.train()
        try:
            while self.step < steps:
                if self._stop:
                    self._preempt(old)
                batch = self.task.batch(self.step, tc["batch_size"]).to(self.device)
                last = self.step == steps - 1
                diag = bool(diag_every) and (self.step % diag_every == 0 or last)
                log = self.step % log_every == 0 or last
                loss, gnorm, metrics = self.train_step(batch, log, diag)
                if not self.check_finite(loss, gnorm, batch):
                    self.res.status = "diverged"
                    if metrics is not None:
                        self._log(metrics)
                    break
                self.optim.step()
                self.sched.step()
                if metrics is not None:
                    row = self._log(metrics)
                    now = time.perf_counter()
                    tps = tokens * (self.step + 1 - n_last) / max(now - t_last, 1e-9)
                    self.res.perf.append({"step": self.step, "perf/tokens_per_s": tps})
                    self.log_fn({**row, "perf/tokens_per_s": tps}, self.step,
                                attn=self.res.attn_weights.get(self.step))
                    if self.progress:
                        self.progress(self.step, row, tps)
                    t_last, n_last = now, self.step + 1
                self.step += 1
                if ckpt_every and self.step % ckpt_every == 0 and self.step < steps:
                    self.save_checkpoint()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        self.res.steps_done = self.step
        if self.res.status == "completed":
            self.res.final = self.evaluate(tc.get("eval_batches", 8))
        return self.res

    def _log(self, metrics: dict) -> dict:
        row = {"step": self.step, **{k: float(v) for k, v in metrics.items()}}
        self.res.rows.append(row)
        return row


def chunk_path(ckpt_path: Path, step: int) -> Path:
    return Path(ckpt_path).parent / f"log-{step:08d}.pt"


def chunks(ckpt_path: Path, upto: int | None = None) -> list[Path]:
    """The chunks beside ckpt_path in step order (up to and including step `upto`)."""
    found = sorted(Path(ckpt_path).parent.glob("log-*.pt"))
    return [p for p in found if upto is None or int(p.stem[4:]) <= upto]


def remove_checkpoint(ckpt_path: Path):
    """A finished run leaves nothing to resume from: ckpt.pt and its chunks go."""
    for p in [Path(ckpt_path), *chunks(ckpt_path)]:
        p.unlink(missing_ok=True)


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def write_metrics(run_dir: Path, res: RunResult):
    write_rows_csv(Path(run_dir) / "metrics.csv", res.rows)
    if res.perf:
        write_rows_csv(Path(run_dir) / "perf.csv", res.perf)
