"""Char-level text (tiny Shakespeare): nanoGPT's shakespeare_char, as a Task.

The corpus comes from data.path, else data/cache/, else the project's shared copy, else it is
downloaded once into data/cache/. Vocabulary: the sorted distinct characters of the whole text
(65 for tiny Shakespeare); first 90% train, last 10% val. Batch `step` is a pure function of
(seed, split, step) like every Task: random windows drawn from a per-step generator.
"""
import functools
import urllib.request
from pathlib import Path

import torch

from data.synthetic import Batch, Task

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "data" / "cache" / "tinyshakespeare.txt"
SHARED = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"  # beside the clone in CI


def _download(dest: Path, url: str = URL, timeout: float = 10.0) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = r.read()
    except OSError as e:  # URLError, timeouts, DNS: all OSError
        reason = getattr(e, "reason", e)
        raise ValueError(f"data.path: no corpus file at {CACHE} and download from {url} failed "
                         f"({reason}); pass data.path=/path/to/tinyshakespeare.txt") from None
    tmp = dest.with_suffix(".part")
    tmp.write_bytes(body)
    tmp.replace(dest)  # atomic: a broken download never looks like a corpus
    return dest


def corpus_path(path: str | None, url: str = URL) -> Path:
    """The file to read: an explicit path must exist; otherwise cache, shared copy, download."""
    if path:
        p = Path(path).expanduser()
        if not p.is_file():
            raise ValueError(f"data.path={path!r} is not a file")
        return p
    for p in (CACHE, SHARED):
        if p.is_file():
            return p
    return _download(CACHE, url)


@functools.lru_cache(maxsize=4)
def load_corpus(path: Path) -> tuple[list[str], torch.Tensor]:
    """(sorted distinct characters, the text as ids); cached: preflight and the run share it."""
    text = path.read_text(encoding="utf-8")
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    return chars, torch.tensor([stoi[c] for c in text], dtype=torch.long)


class CharText(Task):
    """Next-character prediction on windows of seq_len + 1 characters."""
    name = "shakespeare_char"

    def __init__(self, path: str | None = None, seq_len: int = 64, vocab_size: int | None = None,
                 train_fraction: float = 0.9, url: str = URL, seed: int = 0):
        super().__init__(seed)
        if seq_len < 1:
            raise ValueError(f"data.seq_len={seq_len} must be positive")
        if not 0.0 < train_fraction < 1.0:
            raise ValueError(f"data.train_fraction={train_fraction} must be in (0, 1)")
        self.path = corpus_path(path, url)
        self.chars, ids = load_corpus(self.path.resolve())
        if vocab_size is not None and vocab_size != len(self.chars):
            raise ValueError(f"data.vocab_size={vocab_size} but {self.path.name} has "
                             f"{len(self.chars)} distinct characters; leave it null")
        self.vocab_size, self.input_len = len(self.chars), seq_len
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        n = int(train_fraction * len(ids))
        self.splits = {"train": ids[:n], "val": ids[n:], "test": ids[n:]}
        for split, d in self.splits.items():
            if len(d) <= seq_len + 1:
                raise ValueError(f"data.seq_len={seq_len} is longer than the {split} split ({len(d)} chars)")
        self._window = torch.arange(seq_len + 1)

    def encode(self, s: str) -> torch.Tensor:
        return torch.tensor([self.stoi[c] for c in s], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def batch(self, step: int, batch_size: int, split: str = "train") -> Batch:
        data = self.splits[split]
        g = self.generator(step, split)
        starts = torch.randint(len(data) - self.input_len - 1, (batch_size,), generator=g)
        w = data[starts[:, None] + self._window]  # (B, T + 1) in one gather
        return Batch(w[:, :-1], w[:, 1:])
