"""Deterministic synthetic tasks: batch `step` of a task is a pure function of (seed, split, step),
so a resumed run sees exactly the stream it would have seen, with no state to checkpoint."""
from dataclasses import dataclass, field

import torch

IGNORE = -100  # target value excluded from every loss


@dataclass
class Batch:
    x: torch.Tensor                              # (B, T) inputs
    y: torch.Tensor                              # (B, T) targets, IGNORE where not scored
    groups: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> (B, T) bool: loss/<name>
    key_padding_mask: torch.Tensor | None = None  # (B, T) True on real tokens

    def to(self, device):
        kpm = None if self.key_padding_mask is None else self.key_padding_mask.to(device)
        return Batch(self.x.to(device), self.y.to(device),
                     {k: v.to(device) for k, v in self.groups.items()}, kpm)


class Task:
    """A stream of batches. Subclasses set vocab_size, input_len and implement `sample`."""
    name = "task"
    vocab_size: int
    input_len: int

    def __init__(self, seed: int = 0):
        self.seed = seed

    def generator(self, step: int, split: str) -> torch.Generator:
        offset = {"train": 0, "val": 1, "test": 2}[split]
        return torch.Generator().manual_seed(self.seed * 1_000_003 + step * 3 + offset)

    def batch(self, step: int, batch_size: int, split: str = "train") -> Batch:
        return self.sample(self.generator(step, split), batch_size)

    def sample(self, g: torch.Generator, batch_size: int) -> Batch:
        raise NotImplementedError


class CopyTask(Task):
    """[a_1..a_L, a_1..a_L]: the first half is random (loss floor ln V for any causal model),
    the second half repeats it and is learnable only by attending back L positions (floor 0)."""
    name = "copy"

    def __init__(self, vocab_size: int = 64, seq_len: int = 64, seed: int = 0):
        super().__init__(seed)
        if seq_len < 4 or seq_len % 2:
            raise ValueError(f"data.seq_len={seq_len} must be even and >= 4 for the copy task")
        self.vocab_size, self.half = vocab_size, seq_len // 2
        self.input_len = seq_len - 1

    def sample(self, g, batch_size):
        a = torch.randint(0, self.vocab_size, (batch_size, self.half), generator=g)
        s = torch.cat([a, a], dim=1)
        x, y = s[:, :-1], s[:, 1:]
        pos = torch.arange(self.input_len)
        copy = (pos >= self.half - 1).expand_as(y)  # targets a_1..a_L of the second half
        return Batch(x, y, {"copy": copy, "first_half": ~copy})


PAD_SIDES = ("left", "right")


class PaddedCopyTask(Task):
    """Left-padded copy of variable length: [d_1..d_P, a_1..a_L, a_1..a_L], P = seq_len - 2L,
    L drawn per example from [min_len, max_len]. The padding d_i are random tokens of the same
    vocabulary (distractors a wrong mask lets through) and `key_padding_mask` hides them. Since
    L varies, the copy is solvable only by content (an induction head: find the earlier a_j,
    read the token after it); targets at padding are not scored.
    pad_side="right" gives the same rows with the padding moved behind the real tokens:
    [a_1..a_L, a_1..a_L, d_1..d_P], scored on the same targets."""
    name = "padded_copy"

    def __init__(self, vocab_size: int = 64, seq_len: int = 33, min_len: int = 4,
                 max_len: int | None = None, seed: int = 0, pad_side: str = "left"):
        super().__init__(seed)
        if pad_side not in PAD_SIDES:
            raise ValueError(f"data.pad_side={pad_side!r} is not one of {', '.join(PAD_SIDES)}")
        self.pad_side = pad_side
        max_len = (seq_len - 1) // 2 if max_len is None else max_len
        if not 2 <= min_len <= max_len or 2 * max_len > seq_len - 1:
            raise ValueError(f"data.min_len={min_len}, data.max_len={max_len} need "
                             f"2 <= min_len <= max_len <= (seq_len - 1) // 2 = {(seq_len - 1) // 2}")
        self.vocab_size, self.seq_len = vocab_size, seq_len
        self.min_len, self.max_len = min_len, max_len
        self.input_len = seq_len - 1

    def sample(self, g, batch_size):
        T, V = self.seq_len, self.vocab_size
        lengths = torch.randint(self.min_len, self.max_len + 1, (batch_size, 1), generator=g)
        start = T - 2 * lengths                        # first real token
        pos = torch.arange(T)[None, :]
        a = torch.randint(0, V, (batch_size, T), generator=g)
        d = torch.randint(0, V, (batch_size, T), generator=g)
        src = (start + (pos - start) % lengths).clamp(0, T - 1)  # second half reads the first
        s = torch.where(pos >= start, a.gather(1, src), d)
        if self.pad_side == "right":                   # the same row rotated: real tokens first
            s, start = s.gather(1, (pos + start) % T), torch.zeros_like(start)
        x, y = s[:, :-1], s[:, 1:].clone()
        tpos = pos[:, 1:]                              # position of each target
        real = (tpos > start) & (tpos < start + 2 * lengths)  # the target a_1 follows padding: unscored
        y[~real] = IGNORE
        copy = real & (tpos > start + lengths)         # a_2..a_L of the repeat: an earlier a_j names it
        first = real & (tpos < start + lengths)        # a_2..a_L: random, floor ln V
        # (the repeat's a_1 is in neither group: knowing where padding ends, a model can place it)
        kpm = (pos[:, :-1] >= start) & (pos[:, :-1] < start + 2 * lengths)
        return Batch(x, y, {"copy": copy, "first_half": first}, key_padding_mask=kpm)


class TwoFactsTask(Task):
    """[noise.. a ..a.. | ..b.. b ..noise.., Q] -> the pair token (a, b) at the query Q.

    Fact a fills 1..max_copies random positions of the first half, fact b of the second; noise
    comes from its own token set, so finding the facts is easy and keeping them apart is the test.
    The lesson's mechanism decides by construction:
      shared_values  a and b come from one value set: only their half tells them apart, so W_v
                     cannot write them into separate subspaces (false: b has its own tokens);
      ordered        the answer (a, b) differs from (b, a), so the equal-weight average
                     (v_a + v_b) / 2 cannot fix it: accuracy ceiling (K + 1) / 2K;
      max_copies     one head can still tell a from b by weighting them unequally; with a random
                     number of copies of each, the shares in one softmax follow the copy counts,
                     and the inequality no longer says which is which. A head that attends to
                     one fact only averages copies of the same value: unaffected.
    Only the answer is scored (groups: answer)."""
    name = "two_facts"

    def __init__(self, n_values: int = 8, n_noise: int = 16, seq_len: int = 24, max_copies: int = 1,
                 ordered: bool = True, shared_values: bool = True, vocab_size: int | None = None,
                 seed: int = 0):
        super().__init__(seed)
        if n_values < 2:
            raise ValueError(f"data.n_values={n_values} must be >= 2")
        if n_noise < 1:
            raise ValueError(f"data.n_noise={n_noise} must be >= 1")
        half = (seq_len - 1) // 2              # a in [0, half), b in [half, seq_len - 1)
        if max_copies < 1 or max_copies > half:
            raise ValueError(f"data.max_copies={max_copies} must be in [1, (seq_len - 1) // 2 = {half}]")
        self.K, self.D, self.copies = n_values, n_noise, max_copies
        self.ordered, self.shared = ordered, shared_values
        self.noise0 = 2 * n_values             # [0, K) values of a, [K, 2K) of b unless shared
        self.query = self.noise0 + n_noise
        self.answer0 = self.query + 1          # the answer token of (a, b) is answer0 + a K + b
        self.vocab_size = self.answer0 + n_values ** 2
        if vocab_size is not None and vocab_size != self.vocab_size:
            raise ValueError(f"data.vocab_size={vocab_size} must be null or {self.vocab_size} for "
                             f"two_facts (2 n_values + n_noise + 1 + n_values^2)")
        self.input_len, self.half = seq_len, half

    @property
    def average_ceiling(self) -> float:
        """Best accuracy from the equal-weight average alone: it fixes {a, b}, not the order."""
        return (self.K + 1) / (2 * self.K) if self.ordered else 1.0

    def _spots(self, g, B, lo, hi):
        """(B, T) bool: 1..max_copies distinct random positions in [lo, hi) per row."""
        n = torch.randint(1, self.copies + 1, (B, 1), generator=g)
        rank = torch.rand(B, hi - lo, generator=g).argsort(1).argsort(1)
        spots = torch.zeros(B, self.input_len, dtype=torch.bool)
        spots[:, lo:hi] = rank < n
        return spots

    def sample(self, g, batch_size):
        B, T, K = batch_size, self.input_len, self.K
        x = torch.randint(self.noise0, self.noise0 + self.D, (B, T), generator=g)
        a = torch.randint(0, K, (B, 1), generator=g)
        b = torch.randint(0, K, (B, 1), generator=g)
        x = torch.where(self._spots(g, B, 0, self.half), a, x)
        x = torch.where(self._spots(g, B, self.half, T - 1), b + (0 if self.shared else K), x)
        x[:, -1] = self.query
        first, second = (a, b) if self.ordered else (torch.minimum(a, b), torch.maximum(a, b))
        y = torch.full((B, T), IGNORE)
        y[:, -1:] = self.answer0 + first * K + second
        answer = torch.zeros(B, T, dtype=torch.bool)
        answer[:, -1] = True
        return Batch(x, y, {"answer": answer})

    def fact_masks(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 2, T) bool: the positions of fact a and of fact b, read back from the tokens."""
        is_fact = x < self.noise0
        first = torch.arange(x.shape[1]) < self.half
        return torch.stack([is_fact & first, is_fact & ~first], 1)


TASKS: dict[str, type[Task]] = {"copy": CopyTask, "two_facts": TwoFactsTask, "padded_copy": PaddedCopyTask}


def build_task(data_cfg: dict, seed: int = 0) -> Task:
    """data_cfg: {name, vocab_size, seq_len, ...task-specific}."""
    cfg = dict(data_cfg)
    name = cfg.pop("name")
    if name not in TASKS:
        raise ValueError(f"data.name={name!r} is not one of {', '.join(TASKS)}")
    cls = TASKS[name]
    return cls(seed=seed, **cfg)
