"""The config's schema: every key a run reads, its type and what it may be, checked in preflight
before a model is built or a file is written.

Defaults live in conf/*.yaml only; this says what a value may be, not what it is. Choices are read
from the tables that dispatch them (a new softmax goes into SOFTMAXES and is allowed here at once).
Why not Hydra structured configs: a dataclass per group would be a second home for every default,
and OmegaConf's type errors surface inside Hydra's compose as multi-line tracebacks; a table
checked against the composed dict gives one line naming the key, the value and what is allowed.

    python -m experiments.schema                          # every key and what it allows (markdown)
    python -m experiments.schema --write docs/config.md   # refresh that page's table
"""
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from experiments.suggest import did_you_mean


class ConfigError(ValueError):
    """A bad config value: one line, exit 2, nothing trained or recorded."""


@dataclass(frozen=True)
class Key:
    kind: str                       # int | float | bool | str | list
    lo: float | None = None         # inclusive bounds unless *_open
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    choices: Callable[[], tuple] | tuple | None = None
    null: bool = False              # null allowed (means: derived, see the YAML comment)
    number: bool = False            # with choices: a number in [lo, hi] is allowed as well

    def options(self) -> tuple:
        return tuple(self.choices()) if callable(self.choices) else tuple(self.choices or ())

    def allowed(self) -> str:
        parts = []
        if self.choices is not None:
            parts.append("one of " + ", ".join(map(_show, self.options())))
        if self.choices is None or self.number:
            noun = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
                    "list": "a list"}[self.kind if not self.number else "float"]
            parts.append(noun + self._range())
        if self.null:
            parts.append("null")
        return " or ".join(parts)

    def _range(self) -> str:
        lo, hi = self.lo, self.hi
        if lo is not None and hi is not None:
            return f" in {'(' if self.lo_open else '['}{_show(lo)}, {_show(hi)}{')' if self.hi_open else ']'}"
        if lo is not None:
            return f" {'>' if self.lo_open else '>='} {_show(lo)}"
        if hi is not None:
            return f" {'<' if self.hi_open else '<='} {_show(hi)}"
        return ""

    def ok(self, v) -> bool:
        if v is None:
            return self.null
        if self.choices is not None and _in(v, self.options()):
            return True
        if self.choices is not None and not self.number:
            return False
        kind = "float" if self.number else self.kind
        if kind == "bool":
            return isinstance(v, bool)
        if kind == "str":
            return isinstance(v, str)
        if kind == "list":
            return isinstance(v, list)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind == "int" and not isinstance(v, int)):
            return False
        if not math.isfinite(v):
            return False
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        return not (self.hi is not None and (v >= self.hi if self.hi_open else v > self.hi))


def _in(v, options) -> bool:  # True == 1 in Python: a bool matches only a bool
    return any(v == o and isinstance(v, bool) == isinstance(o, bool) for o in options)


def _show(x) -> str:
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


def _value(v) -> str:
    return repr(v) if isinstance(v, str) else _show(v) if v is not None else "null"


# -- the tables the choices come from (imported late: the schema is read before torch is needed) --
def _softmaxes():
    from attention.softmax import SOFTMAXES
    return tuple(SOFTMAXES)


def _attention(name):
    def f():
        import attention.masks as masks
        import attention.mha as mha
        return tuple(getattr(mha, name, None) or getattr(masks, name))
    return f


def _scores():
    from attention.scoring import SCORINGS
    return tuple(SCORINGS)


def _inits():
    from attention.lm import INITS
    return INITS


def _lm(name):
    def f():
        import attention.lm as lm
        return tuple(getattr(lm, name))
    return f


def _pad_sides():
    from data.synthetic import PAD_SIDES
    return PAD_SIDES


def _training(name):
    def f():
        import experiments.training.build as build
        import experiments.training.logger as logger
        table = getattr(build, name, None) or getattr(logger, name)
        return ("auto", *table) if name == "DTYPES" else tuple(table)
    return f


def _tasks():
    from data import TASKS
    return tuple(TASKS)


POS_INT, NONNEG_INT = Key("int", lo=1), Key("int", lo=0)
PROB = Key("float", lo=0, hi=1, hi_open=True)

SCHEMA: dict[str, Key] = {
    "seed": NONNEG_INT,
    "device": Key("str", choices=("auto", "cpu", "cuda", "mps")),
    "results_dir": Key("str"),
    # data: the keys every task has; a task's own keys are in TASK_KEYS
    "data.name": Key("str", choices=_tasks),
    "data.seq_len": POS_INT,
    "model.block_size": POS_INT,
    "model.d_model": POS_INT,
    "model.n_layers": POS_INT,
    "model.n_heads": POS_INT,
    "model.n_kv_heads": Key("int", lo=1, null=True),
    "model.d_ff": Key("int", lo=1, null=True),
    "model.dropout": PROB,
    "model.bias": Key("bool"),
    "model.tie_weights": Key("bool"),
    "model.init": Key("str", choices=_inits),
    "model.qk_gain": Key("float", lo=0, lo_open=True),
    "model.mlp": Key("bool"),
    "model.residual": Key("bool"),
    "model.attention.d_k": Key("int", lo=1, null=True),
    "model.attention.d_v": Key("int", lo=1, null=True),
    "model.attention.scale": Key("str", choices=_attention("SCALES"), number=True, lo=0, lo_open=True),
    "model.attention.softmax": Key("str", choices=_softmaxes),
    "model.attention.score": Key("str", choices=_scores),
    "model.attention.qk_norm": Key("bool"),
    "model.attention.mask_mode": Key("str", choices=_attention("MASK_MODES")),
    "model.attention.mask_fill": Key("str", choices=_attention("MASK_FILLS")),
    "model.attention.merge": Key("str", choices=_attention("MERGES")),
    "model.attention.backend": Key("str", choices=_attention("BACKENDS")),
    "model.attention.dropout": PROB,
    "model.attention.softcap": Key("float", lo=0, lo_open=True, null=True),
    "model.attention.qk_clip": Key("float", lo=0, lo_open=True, null=True),
    "model.attention.sigma_reparam": Key("bool"),
    "model.pos": Key("str", choices=_lm("POSITIONS")),
    "model.pad_positions": Key("str", choices=_lm("PAD_POSITIONS")),
    "model.attention.rope_dtype": Key("str", choices=_attention("ROPE_DTYPES")),
    "model.attention.causal_align": Key("str", choices=_attention("CAUSAL_ALIGNS")),
    "model.attention.causal": Key("str", choices=_attention("CAUSALS")),
    "model.attention.mask_combine": Key("str", choices=_attention("MASK_COMBINES")),
    "model.attention.upcast": Key("bool"),
    "model.attention.reach": Key("str", choices=_attention("REACHES")),
    "optim.name": Key("str", choices=_training("OPTIMIZERS")),
    "optim.lr": Key("float", lo=0, lo_open=True),
    "optim.weight_decay": Key("float", lo=0),
    "optim.schedule": Key("str", choices=_training("SCHEDULES")),
    "optim.warmup_steps": NONNEG_INT,
    "optim.min_lr": Key("float", lo=0),
    "optim.decay_steps": Key("int", lo=1, null=True),
    "train.steps": POS_INT,
    "train.batch_size": POS_INT,
    "train.log_every": POS_INT,
    "train.diag_every": NONNEG_INT,     # 0: no diagnostic steps
    "train.ckpt_every": NONNEG_INT,     # 0: no checkpoints
    "train.eval_batches": POS_INT,
    "train.grad_clip": Key("float", lo=0),   # 0: no clipping
    "train.dtype": Key("str", choices=_training("DTYPES")),
    "train.compile": Key("bool"),
    "train.progress": Key("str", choices=("auto", True, False)),
    "train.z_loss": Key("float", lo=0),     # PaLM's z-loss coefficient on mean(log Z^2); 0: off
    "logger.name": Key("str", choices=_training("LOGGERS")),
}

OPTIM_KEYS = {
    "adamw": {"optim.betas": Key("list"), "optim.eps": Key("float", lo=0, lo_open=True)},
    "sgd": {"optim.momentum": Key("float", lo=0, hi=1, hi_open=True)},
}

LOGGER_KEYS = {
    "wandb": {"logger.mode": Key("str", choices=("offline", "online", "disabled")),
              "logger.project": Key("str"), "logger.entity": Key("str", null=True)},
    "none": {},
}

# A vocabulary of 1 (chance loss ln 1 = 0) or a copy of length 0 makes every check vacuous.
TASK_KEYS = {
    "copy": {"data.vocab_size": Key("int", lo=2)},
    "padded_copy": {"data.vocab_size": Key("int", lo=2), "data.min_len": POS_INT, "data.max_len": POS_INT,
                    "data.pad_side": Key("str", choices=_pad_sides)},
    "two_facts": {"data.n_values": Key("int", lo=2), "data.n_noise": POS_INT, "data.max_copies": POS_INT,
                  "data.ordered": Key("bool"), "data.shared_values": Key("bool"),
                  "data.vocab_size": Key("int", lo=2, null=True)},
    "shakespeare_char": {"data.path": Key("str", null=True), "data.vocab_size": Key("int", lo=2, null=True),
                         "data.train_fraction": Key("float", lo=0, hi=1, lo_open=True, hi_open=True)},
    "shakespeare_lines": {"data.path": Key("str", null=True), "data.vocab_size": Key("int", lo=2, null=True),
                          "data.train_fraction": Key("float", lo=0, hi=1, lo_open=True, hi_open=True),
                          "data.pad_side": Key("str", choices=_pad_sides)},
    "python_source_char": {"data.vocab_size": Key("int", lo=2, null=True),
                           "data.train_fraction": Key("float", lo=0, hi=1, lo_open=True, hi_open=True)},
    "python_source_lines": {"data.vocab_size": Key("int", lo=2, null=True),
                            "data.train_fraction": Key("float", lo=0, hi=1, lo_open=True, hi_open=True),
                            "data.pad_side": Key("str", choices=_pad_sides)},
}

EXP_KEYS = {"exp.name": Key("str"), "exp.claim": Key("str", null=True),
            "exp.figure_metric": Key("str", null=True)}


# the exp node (conf/config.yaml's `exp`): its fields, and those of its control and floor; the
# fields of a check are judging.checks.FIELDS
EXP_FIELDS = ("name", "broken", "claim", "control", "loss_metric", "figure_metric", "group", "measures",
              "expect", "checks", "text_data", "floor", "no_text_version")
CONTROL_FIELDS = ("name", "overrides", "measures")


def every_key() -> set[str]:
    """Every key the schema knows, whatever the task, optimizer and logger."""
    out = {*SCHEMA, *EXP_KEYS}
    for table in (TASK_KEYS, OPTIM_KEYS, LOGGER_KEYS):
        for keys in table.values():
            out.update(keys)
    return out


def unknown_key(key: str, known, cfg: dict | None = None) -> ConfigError:
    """`key` is nobody's; or, a key of another task / optimizer / logger, not of this one's."""
    for section, table in (("data", TASK_KEYS), ("optim", OPTIM_KEYS), ("logger", LOGGER_KEYS)):
        if cfg and key.startswith(f"{section}.") and any(key in keys for keys in table.values()):
            return ConfigError(f"{key} is not a key of {section}={cfg[section]['name']}")
    return ConfigError(f"{key} is not a config key{did_you_mean(key, known)}")


def leaves(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        out += leaves(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [f"{prefix}{k}"]
    return out


def check_known(cfg: dict, keys: dict) -> None:
    """A key nobody reads (`+train.step=100`) is an error, not a silent no-op."""
    for key in leaves({k: v for k, v in cfg.items() if k not in ("exp", "hydra")}):
        if key not in keys:
            raise unknown_key(key, keys, cfg)
    exp = cfg.get("exp") or {}
    for f in exp:
        if f not in EXP_FIELDS:
            raise unknown_key(f"exp.{f}", [f"exp.{x}" for x in EXP_FIELDS])
    for node in ("control", "floor"):
        for f in exp.get(node) or {}:
            if f not in CONTROL_FIELDS:
                raise unknown_key(f"exp.{node}.{f}", [f"exp.{node}.{x}" for x in CONTROL_FIELDS])


def get(cfg: dict, key: str):
    d = cfg
    for part in key.split("."):
        if not isinstance(d, dict) or part not in d:
            raise ConfigError(f"{key} is missing from the config")
        d = d[part]
    return d


def keys_for(cfg: dict) -> dict[str, Key]:
    """The keys this config must have: the common ones and those of its task, optimizer, logger."""
    out = {**SCHEMA, **EXP_KEYS}
    for key, table in (("data.name", TASK_KEYS), ("optim.name", OPTIM_KEYS), ("logger.name", LOGGER_KEYS)):
        name = get(cfg, key)
        check_value(key, name, out[key])
        out.update(table[name])
    return out


def check_value(key: str, value, spec: Key):
    if not spec.ok(value):
        raise ConfigError(f"{key}={_value(value)} is not allowed: {spec.allowed()}")


def _cross(cfg: dict):
    """Rules over several keys; each message names every key it involves."""
    m, a, d = cfg["model"], cfg["model"]["attention"], cfg["data"]
    if a["d_k"] is None and m["d_model"] % m["n_heads"]:
        raise ConfigError(f"model.d_model={m['d_model']} is not divisible by model.n_heads={m['n_heads']} "
                          f"(or set model.attention.d_k)")
    kv = m["n_kv_heads"]
    if kv is not None and m["n_heads"] % kv:
        raise ConfigError(f"model.n_kv_heads={kv} does not divide model.n_heads={m['n_heads']}")
    from attention.scoring import SCORINGS
    if a["backend"] == "sdpa" and a.get("softcap") is not None:
        raise ConfigError(f"model.attention.backend='sdpa' cannot express softcap={_show(a['softcap'])}: "
                          f"use backend=explicit or auto")
    if a["backend"] == "sdpa" and (a["softmax"] != "stable" or SCORINGS[a["score"]].sdpa_q is None):
        raise ConfigError(f"model.attention.backend='sdpa' cannot express softmax={a['softmax']!r} "
                          f"score={a['score']!r}: use backend=explicit or auto")
    o = cfg["optim"]
    if o["min_lr"] > o["lr"]:
        raise ConfigError(f"optim.min_lr={_show(o['min_lr'])} is above optim.lr={_show(o['lr'])}")
    if o["name"] == "adamw":
        b = o["betas"]
        if len(b) != 2 or not all(isinstance(x, (int, float)) and 0 <= x < 1 for x in b):
            raise ConfigError(f"optim.betas={b} is not allowed: two numbers in [0, 1)")
    name = d["name"]
    if name == "copy" and (d["seq_len"] < 4 or d["seq_len"] % 2):
        raise ConfigError(f"data.seq_len={d['seq_len']} is not allowed for the copy task: an even "
                          f"integer >= 4 (two halves of at least 2 tokens)")
    if name == "padded_copy" and not d["min_len"] <= d["max_len"] <= (d["seq_len"] - 1) // 2:
        raise ConfigError(f"data.min_len={d['min_len']}, data.max_len={d['max_len']} are not allowed with "
                          f"data.seq_len={d['seq_len']}: need min_len <= max_len <= (seq_len - 1) // 2")
    if name == "two_facts" and d["max_copies"] > (d["seq_len"] - 1) // 2:
        raise ConfigError(f"data.max_copies={d['max_copies']} is not allowed with data.seq_len="
                          f"{d['seq_len']}: at most (seq_len - 1) // 2 = {(d['seq_len'] - 1) // 2}")
    if name in ("shakespeare_char", "shakespeare_lines") and d["path"] is not None and not Path(d["path"]).is_file():
        raise ConfigError(f"data.path={d['path']!r} is not a file")
    if m["pos"] == "rope" and (a["d_k"] or m["d_model"] // m["n_heads"]) % 2:
        raise ConfigError(f"model.pos='rope' needs an even head width: d_k="
                          f"{a['d_k'] or m['d_model'] // m['n_heads']} (model.d_model / model.n_heads or "
                          f"model.attention.d_k)")
    if cfg["device"] == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise ConfigError("device='cuda' but no CUDA device is available: use device=auto or cpu")


def validate(cfg: dict) -> None:
    """Raise ConfigError (one line) for the first value the schema does not allow."""
    keys = keys_for(cfg)
    check_known(cfg, keys)
    for key, spec in keys.items():
        check_value(key, get(cfg, key), spec)
    _cross(cfg)


def markdown() -> str:
    rows = ["| key | allowed |", "|---|---|"]
    everything = {**SCHEMA}
    for table in (TASK_KEYS, OPTIM_KEYS, LOGGER_KEYS):
        for name, keys in table.items():
            for k, spec in keys.items():
                everything.setdefault(f"{k} ({name})" if k in everything else k, spec)
    for key, spec in everything.items():
        rows.append(f"| `{key}` | {spec.allowed()} |")
    return "\n".join(rows) + "\n"


BEGIN, END = "<!-- BEGIN schema -->", "<!-- END schema -->"


def write_block(path: Path) -> None:
    """Replace the text between BEGIN and END in `path` by the table."""
    text = Path(path).read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    Path(path).write_text(f"{head}{BEGIN}\n{markdown()}{END}{tail}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"]:
        write_block(Path(sys.argv[2]))
    else:
        sys.stdout.write(markdown())
