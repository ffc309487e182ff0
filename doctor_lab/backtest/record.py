"""The record: record.yaml read into typed entries, its schema enforced. One entry per regression
transformers (or another library the doctor targets: `library`) shipped, with the releases that bracket it (before < introduced < fixed), what it
touched, the condition it needs, the doctor check expected to catch it (or the probe the doctor
lacks), and its repro (repros/<id>.py) or the reason there is none."""
import ast
import enum
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from packaging.version import InvalidVersion, Version

from doctor_lab.backtest import releases

HERE = Path(__file__).parent
RECORD = HERE / "record.yaml"
REPROS = HERE / "repros"
OPEN = "open"
# what a repro may import: it runs on any release, against torch and its library alone
STANDALONE = frozenset({"torch", "transformers", "sys", "os", "math", "warnings"})
# library -> what its repros may import beside the stdlib ones of STANDALONE
IMPORTS = {releases.TRANSFORMERS: STANDALONE,
           "x-transformers": STANDALONE - {"transformers"} | {"x_transformers"},
           "diffusers": STANDALONE - {"transformers"} | {"diffusers"}}


class Condition(str, enum.Enum):
    """What the regression needs before it shows."""
    LEFT_PADDING = "left_padding"
    RIGHT_PADDING = "right_padding"
    CACHE = "cache"                        # a KV cache (prefill, then more tokens)
    MULTI_TOKEN_STEP = "multi_token_step"  # several new tokens after a cache in one call
    NO_MASK = "no_mask"                    # no attention mask passed
    BEYOND_WINDOW = "beyond_window"        # T (or the cache) longer than the sliding window
    PACKED = "packed"                      # several documents in a row, position ids restarting
    FLEX = "flex_attention"
    FLOAT16 = "float16"
    TRAINING = "training"                  # labels / token_type_ids given, or train mode
    IMAGE_TOKENS = "image_tokens"          # a multimodal prefix (image tokens)
    DECODER_CONFIG = "decoder_config"      # an encoder architecture configured as a causal decoder
    SCALE_CONFIG = "scale_config"          # a config flag that changes the scores' scale (GPT-2's scale_attn_*)
    SAVE_LOAD = "save_load"                # the model saved (save_pretrained) and loaded back (from_pretrained)
    DEFAULT_IMPL = "default_implementation"  # the implementation the model picks when none is asked for
    CONFIG_OPTION = "config_option"        # a config value other than the default (the note names it)
    PLAIN = "plain_forward"                # nothing beyond the default config and a plain forward
    GPU = "gpu"


class Impl(str, enum.Enum):
    EAGER = "eager"
    SDPA = "sdpa"
    FLEX = "flex_attention"
    FLASH = "flash_attention_2"


# probes the doctor does not have yet (issue 46, part 2), named where an entry needs one
PROBES = frozenset({
    "packed_sequences",        # documents in one row, position ids restarting
    "rope_channels",           # which channels a RoPE turns: each axis only its own (frames, rows, columns), none of a
                               # partial rotary's unrotated share
    "call_state",              # a forward's output moved by an earlier forward (state a module keeps between calls)
    "cache_rollback",          # a cache cropped back after rejected draft tokens (assisted / speculative decoding)
})
FIELDS = ("id", "title", "threads", "introduced", "fixed", "before", "architectures", "implementations",
          "condition", "check", "repro", "verified")
OPTIONAL = ("no_repro", "history", "note", "config", "library")


@dataclass(frozen=True)
class Regression:
    id: str
    title: str
    threads: tuple[str, ...]
    before: str
    introduced: str
    fixed: str                     # a release, or OPEN
    architectures: tuple[str, ...]
    implementations: tuple[Impl, ...]
    condition: tuple[Condition, ...]
    check: str                     # a registered doctor check, or a name of PROBES
    repro: Path | None
    no_repro: str = ""             # why there is no CPU repro (a GPU, trained weights)
    verified: dict = field(default_factory=dict)  # release -> exit code measured
    history: dict = field(default_factory=dict)   # further releases measured while bisecting
    note: str = ""
    # values the regression needs on the zoo's shrunk configs (a window where the defaults set none),
    # given at construction (the zoo's --init); sorted (key, value) pairs
    config: tuple[tuple[str, object], ...] = ()
    library: str = releases.TRANSFORMERS   # the package the releases are of (releases.LIBRARIES)

    @property
    def releases(self) -> tuple[str, ...]:
        """The releases its repro runs on, in order; the exit code each must give."""
        return tuple(r for r in (self.before, self.introduced, self.fixed) if r != OPEN)

    def expected(self, release: str) -> int:
        return 1 if release == self.introduced else 0


class RecordError(ValueError):
    pass


def _version(entry: str, name: str, value, real: frozenset[str], library: str = releases.TRANSFORMERS) -> Version:
    """A release on the package index (releases.known(library)), as a Version."""
    try:
        v = Version(str(value))
    except InvalidVersion:
        v = None
    if v is None or str(value) not in real:
        raise RecordError(f"{entry}: {name} {value!r} is not a {library} release ({releases.known_file(library).name})")
    return v


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
    return names


def parse(raw: dict, checks: frozenset[str], real: frozenset[str] | None = None) -> Regression:
    """One entry, checked: every field, releases in order (on its library's index; real: transformers'
    releases, given), the repro standalone."""
    ident = raw.get("id", "?")
    missing = [f for f in FIELDS if f not in raw]
    unknown = [f for f in raw if f not in FIELDS + OPTIONAL]
    if missing or unknown:
        raise RecordError(f"{ident}: missing {missing} / unknown {unknown}")
    if not re.fullmatch(r"[a-z0-9_]+", ident):
        raise RecordError(f"{ident}: an id is lower_snake_case")
    library = raw.get("library", releases.TRANSFORMERS)
    if library not in releases.LIBRARIES:
        raise RecordError(f"{ident}: library {library!r} is none of {sorted(releases.LIBRARIES)}")
    if real is None or library != releases.TRANSFORMERS:
        real = frozenset(releases.known(library))
    before = _version(ident, "before", raw["before"], real, library)
    introduced = _version(ident, "introduced", raw["introduced"], real, library)
    if not before < introduced:
        raise RecordError(f"{ident}: before {before} is not older than introduced {introduced}")
    older = [v for v in real if Version(v) < introduced]
    if str(raw["before"]) != max(older, key=Version, default=None):
        raise RecordError(f"{ident}: before is the release just before {introduced} on the index, "
                          f"{max(older, key=Version, default='none')}, not {raw['before']}")
    if raw["fixed"] != OPEN and not introduced < _version(ident, "fixed", raw["fixed"], real, library):
        raise RecordError(f"{ident}: fixed {raw['fixed']} is not newer than introduced {introduced}")
    threads = tuple(raw["threads"])
    if not threads or not all(re.fullmatch(r"[\w.-]+/[\w.-]+ #\d+", t) for t in threads):
        raise RecordError(f"{ident}: threads are 'owner/repo #N', at least one: {threads}")
    if raw["check"] not in checks | PROBES:
        raise RecordError(f"{ident}: check {raw['check']!r} is neither a doctor check nor one of {sorted(PROBES)}")
    try:
        impls = tuple(Impl(i) for i in raw["implementations"])
        cond = tuple(Condition(c) for c in raw["condition"])
    except ValueError as e:
        raise RecordError(f"{ident}: {e}") from None
    repro = None
    if raw["repro"] is None:
        if not raw.get("no_repro"):
            raise RecordError(f"{ident}: no repro and no reason (no_repro)")
    else:
        repro = HERE / raw["repro"]
        if repro != REPROS / f"{ident}.py" or not repro.is_file():
            raise RecordError(f"{ident}: repro is repros/{ident}.py, and it exists: {raw['repro']}")
        extra = _imports(repro) - IMPORTS[library]
        if extra:
            raise RecordError(f"{ident}: the repro imports {sorted(extra)}: torch, {library} and the stdlib only")
    verified = {str(k): v for k, v in (raw["verified"] or {}).items()}
    history = {str(k): v for k, v in (raw.get("history") or {}).items()}
    for r, code in {**verified, **history}.items():
        _version(ident, "a measured release", r, real, library)
        if code not in (0, 1, 2):
            raise RecordError(f"{ident}: exit code {code!r} at {r}")
    if not raw["architectures"]:
        raise RecordError(f"{ident}: no architectures")
    config = raw.get("config") or {}
    if not isinstance(config, dict) or not all(isinstance(k, str) and (v is None or isinstance(v, (bool, int, float, str)))
                                                 for k, v in config.items()):
        raise RecordError(f"{ident}: config maps config keys to plain values: {config!r}")
    return Regression(ident, raw["title"], threads, str(raw["before"]), str(raw["introduced"]), str(raw["fixed"]),
                      tuple(raw["architectures"]), impls, cond, raw["check"], repro, raw.get("no_repro", ""),
                      verified, history, raw.get("note", ""), tuple(sorted(config.items())), library)


def registered_checks() -> frozenset[str]:
    from attention_doctor.checks import ORDER
    return frozenset(ORDER)


def load(path: Path = RECORD, checks: frozenset[str] | None = None) -> list[Regression]:
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, list):
        raise RecordError(f"{path}: a list of entries")
    checks = registered_checks() if checks is None else checks
    real = frozenset(releases.known())
    entries = [parse(e, checks, real) for e in raw]
    ids = [e.id for e in entries]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise RecordError(f"{path}: ids twice: {sorted(dup)}")
    return entries
