"""Deterministic synthetic tasks: batch `step` of a task is a pure function of (seed, split, step),
so a resumed run sees exactly the stream it would have seen, with no state to checkpoint."""
import math
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

    @property
    def chance_loss(self) -> float:
        return math.log(self.vocab_size)


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


TASKS: dict[str, type[Task]] = {"copy": CopyTask}


def build_task(data_cfg: dict, seed: int = 0) -> Task:
    """data_cfg: {name, vocab_size, seq_len, ...task-specific}."""
    cfg = dict(data_cfg)
    name = cfg.pop("name")
    if name not in TASKS:
        raise ValueError(f"data.name={name!r} is not one of {', '.join(TASKS)}")
    cls = TASKS[name]
    return cls(seed=seed, **cfg)
