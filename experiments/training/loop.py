"""The training loop: a step is forward, loss, backward, clip, optimizer step; on logged steps a
row of metrics, on diagnostic steps the attention statistics (attention.diagnostics.Recorder).
Checkpoints (checkpoint.py), preemption (preemption.py) and the NaN locator (nan_locator.py) sit
beside the loop. Knows nothing of experiments or verdicts."""
import random
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from attention.diagnostics import Recorder
from data import Batch, build_task
from data.synthetic import IGNORE
from experiments.io import write_rows_csv
from experiments.layout import METRICS, PERF
from experiments.training import checkpoint
from experiments.training.build import autocast_dtype, build_model, build_optimizer, lr_lambda, pick_device
from experiments.training.nan_locator import locate
from experiments.training.preemption import StopSignals


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


def token_losses(logits, batch: Batch):
    """Per-token cross-entropy (B, T); IGNORE targets give 0."""
    # (B*T, V) rows, not (B, V, T): the 2-D kernel is the faster one, forward and backward
    return F.cross_entropy(logits.float().flatten(0, 1), batch.y.flatten(), ignore_index=IGNORE,
                           reduction="none").view(batch.y.shape)


def log_z(logits):
    """The output softmax's log-normaliser per token (B, T): logsumexp of the LM head's logits."""
    return torch.logsumexp(logits.float(), dim=-1)


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


class Trainer:
    def __init__(self, cfg, run_dir: Path, ckpt_path: Path | None = None, log_fn=None, progress=None):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.tc = cfg["train"]
        self.device = pick_device(cfg["device"])
        self.amp_dtype = autocast_dtype(self.tc["dtype"], self.device)
        torch.manual_seed(cfg["seed"])
        random.seed(cfg["seed"])
        self.task = build_task(cfg["data"], seed=cfg["seed"])
        self.model = build_model(cfg["model"], self.task).to(self.device)
        self.optim = build_optimizer(cfg["optim"], self.model, self.device)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.optim, lr_lambda(cfg["optim"], self.tc["steps"]))
        self.forward = torch.compile(self.model) if self.tc["compile"] else self.model
        self.ckpt_path = ckpt_path
        self.log_fn = log_fn or (lambda metrics, step, attn=None: None)
        self.progress = progress
        self.res = RunResult(params=self.model.param_count())
        self.step = 0
        self.chunked_upto = 0  # rows and weights of steps before this are in checkpoint chunks

    def amp(self):
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def save_checkpoint(self):
        checkpoint.save(self)

    def try_resume(self) -> bool:
        return checkpoint.resume(self)

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
        loss = ce = mean_loss(per_tok, batch)
        z_coef = self.tc.get("z_loss", 0.0)
        lz = log_z(logits) if z_coef or log or diag else None          # (B, T)
        if z_coef:  # PaLM's z-loss: pulls log Z towards 0 (Wortsman et al. 2023, sec 3.2)
            loss = loss + z_coef * mean_loss(lz.pow(2), batch)
        self.optim.zero_grad(set_to_none=True)
        loss.backward()
        clip = self.tc["grad_clip"]
        if clip > 0:
            gnorm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        elif log:
            gnorm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), float("inf"))
        else:
            gnorm = None
        metrics = None
        if log or diag:
            metrics = {"loss/train": ce.detach(), "lr": self.sched.get_last_lr()[0]}
            metrics.update(group_metrics(per_tok.detach(), logits.detach(), batch))
            metrics["logz/mean"] = mean_loss(lz.detach(), batch)
            metrics["logz/max_abs"] = lz.detach().masked_fill(batch.y == IGNORE, 0).abs().max()
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

    def finite(self, loss, gnorm) -> bool:
        # one host sync per step (not two): gnorm >= 0, so the sum is finite iff both are
        return bool(torch.isfinite(loss.detach() if gnorm is None else loss.detach() + gnorm))

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
    def run(self) -> RunResult:
        tc = self.tc
        steps, log_every, diag_every, ckpt_every = tc["steps"], tc["log_every"], tc["diag_every"], tc["ckpt_every"]
        self.try_resume()
        tokens = tc["batch_size"] * self.task.input_len
        t_last, n_last = time.perf_counter(), self.step
        self.model.train()
        with StopSignals() as signals:
            while self.step < steps:
                if signals.signum:
                    signals.stop(self.step, self.save_checkpoint, self.ckpt_path)
                batch = self.task.batch(self.step, tc["batch_size"]).to(self.device)
                last = self.step == steps - 1
                diag = bool(diag_every) and (self.step % diag_every == 0 or last)
                log = self.step % log_every == 0 or last
                loss, gnorm, metrics = self.train_step(batch, log, diag)
                if not self.finite(loss, gnorm):
                    self.res.nonfinite = {"step": self.step, **locate(self.model, batch, self.amp, loss)}
                    self.res.status = "diverged"
                    if metrics is not None:
                        self._log(metrics)
                    break
                self.optim.step()
                if self.model.cfg.attn.qk_clip is not None:  # QK-clip acts on the weights the step left
                    for a in self.model.attentions:
                        a.qk_clip_()
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
        self.res.steps_done = self.step
        if self.res.status == "completed":
            self.res.final = self.evaluate(tc["eval_batches"])
        return self.res

    def _log(self, metrics: dict) -> dict:
        row = {"step": self.step, **{k: float(v) for k, v in metrics.items()}}
        self.res.rows.append(row)
        return row


def write_metrics(run_dir: Path, res: RunResult):
    write_rows_csv(Path(run_dir) / METRICS, res.rows)
    if res.perf:
        write_rows_csv(Path(run_dir) / PERF, res.perf)
