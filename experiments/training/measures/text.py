"""Greedy samples of a text model and two measures of how garbled they are, wired through
`exp.measures: ["greedy_sample"]` (char-level text tasks only). The samples are strings in the
run's final metrics (summary.json), where the report's text-samples section reads them."""
import functools
import math

import torch

PROMPT_CHARS = 32   # the prompt: this many val characters from the start of its first speech
SAMPLE_CHARS = 200  # greedy characters generated after it
NGRAM = 4           # repetition: the share of repeated character 4-grams
SMOOTH = 0.1        # add-k smoothing of the trigram counts
PREFIX_ROWS = 16    # val rows whose every target is predicted from its prefix alone


@torch.no_grad()
def greedy(model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """n greedy tokens after the 1-D prompt, each predicted from the last block_size tokens
    (a sliding window, recomputed every step: no KV cache, so no path the failure may not share)."""
    was_training = model.training
    model.eval()
    out = prompt[None, :]
    try:
        for _ in range(n):
            logits = model(out[:, -model.cfg.block_size:])
            out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    finally:
        model.train(was_training)
    return out[0, len(prompt):]


@functools.lru_cache(maxsize=2)
def _trigram_logp(train: torch.Tensor, V: int) -> torch.Tensor:
    """(V, V, V) log P(c | a, b) of the training split, add-k smoothed."""
    idx = (train[:-2] * V + train[1:-1]) * V + train[2:]
    counts = torch.bincount(idx, minlength=V ** 3).view(V, V, V).double() + SMOOTH
    return (counts / counts.sum(-1, keepdim=True)).log()


def trigram_nll(ids: torch.Tensor, train: torch.Tensor, V: int) -> float:
    """Mean nats per character of ids (from its third) under a character trigram model of the
    training split: a yardstick that needs no trained network and is the same for every run.
    Real text scores ~2 nats; text no Shakespeare line would contain scores high."""
    lp = _trigram_logp(train, V)
    return float(-lp[ids[:-2], ids[1:-1], ids[2:]].mean())


def repeat_frac(ids: torch.Tensor, n: int = NGRAM) -> float:
    """The share of n-grams that repeat an earlier one: 0 for text that never repeats itself,
    near 1 for a loop ("the the the ...")."""
    if len(ids) < n:
        return math.nan
    grams = ids.unfold(0, n, 1)
    return 1.0 - len(torch.unique(grams, dim=0)) / len(grams)


@torch.no_grad()
def prefix_loss(model, b) -> tuple[float, float]:
    """(loss with each target predicted from its prefix alone, as generation predicts it;
    the usual teacher-forced loss of one forward) on batch b. Equal for a causal model: a gap
    is what a model read from positions after the one it predicts."""
    from experiments.training.loop import mean_loss, token_losses
    was_training = model.training
    model.eval()
    try:
        kpm = b.key_padding_mask
        full = mean_loss(token_losses(model(b.x, key_padding_mask=kpm), b), b)
        T, per_tok = b.x.shape[1], torch.zeros(b.y.shape)
        for t in range(T):
            logits = model(b.x[:, :t + 1], key_padding_mask=None if kpm is None else kpm[:, :t + 1])
            per_tok[:, t] = torch.nn.functional.cross_entropy(logits[:, -1].float(), b.y[:, t], ignore_index=-100,
                                                              reduction="none")
    finally:
        model.train(was_training)
    return float(mean_loss(per_tok, b)), float(full)


def prompt_ids(task) -> torch.Tensor:
    """The fixed prompt: the val split's first speech (after its first blank line), cut."""
    val, nl = task.splits["val"], task.stoi["\n"]
    blank = ((val[:-1] == nl) & (val[1:] == nl)).nonzero()
    start = int(blank[0]) + 2 if len(blank) else 0
    return val[start:start + PROMPT_CHARS]


def greedy_sample(trainer, cfg, n: int = SAMPLE_CHARS) -> dict:
    """The prompt, the model's n greedy characters after it, and the sample's trigram loss and
    repetition beside those of the text that really follows the prompt in the val split; and the
    val loss as generation meets it (each target from its prefix alone) beside the usual one."""
    task, model = trainer.task, trainer.model
    if not hasattr(task, "decode"):
        raise ValueError(f"text:greedy_sample needs a text task, not data.name={task.name!r}")
    prompt = prompt_ids(task)
    sample = greedy(model, prompt.to(trainer.device), n).cpu()
    train, V = task.splits["train"], task.vocab_size
    val = task.splits["val"]
    at = int((val.unfold(0, len(prompt), 1) == prompt).all(1).nonzero()[0])
    real = val[at + len(prompt): at + len(prompt) + n]
    b = task.batch(0, min(trainer.tc["batch_size"], PREFIX_ROWS), "val").to(trainer.device)
    gen, forced = prefix_loss(model, b)
    return {"gen/prefix_loss": gen, "gen/teacher_forced_loss": forced, "gen/gap": gen - forced,
            "sample/prompt": task.decode(prompt), "sample/greedy": task.decode(sample),
            "sample/trigram_nll": trigram_nll(torch.cat([prompt[-2:], sample]), train, V),
            "sample/repeat_frac": repeat_frac(sample),
            "sample/real_trigram_nll": trigram_nll(torch.cat([prompt[-2:], real]), train, V),
            "sample/real_repeat_frac": repeat_frac(real),
            "sample/chars": float(len(sample)), "sample/ln_V": math.log(V)}
