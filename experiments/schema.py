"""The config's schema: every key a run reads, its type and what it may be, validated in preflight
before a model is built or a file is written.

The model's keys (model.*, model.attention.*) are attention.config's fields: the library declares
each once, with its default and what it may be, and validates itself by the same rules. The other
keys are declared here; their defaults live in conf/*.yaml. Choices are read from the tables that
dispatch them (a new softmax goes into SOFTMAXES and is allowed here at once). Why not Hydra
structured configs: OmegaConf's type errors surface inside Hydra's compose as multi-line
tracebacks; a table validated against the composed dict gives one line naming the key, the value
and what is allowed.

    python -m experiments.schema                          # every key and what it allows (markdown)
    python -m experiments.schema --write docs/config.md   # refresh that page's table
"""
import sys
from pathlib import Path

from attention.config import NONNEG_INT, POS_INT, Allowed, ModelConfig, config_fields, not_allowed, show
from experiments.suggest import did_you_mean


class ConfigError(ValueError):
    """A bad config value: one line, exit 2, nothing trained or recorded."""


# -- the choices of the training run's own switches (training/build.py and logger.py dispatch them) --
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("float32", "bfloat16", "float16")   # autocast's dtype; auto: bfloat16 on CUDA, none elsewhere
OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("constant", "cosine")
LOGGERS = ("wandb", "none")
LOGGER_MODES = ("offline", "online", "disabled")


# -- the library's tables (read late: they need torch) --------------------------------------------
def _pad_sides():
    from data.synthetic import PAD_SIDES
    return PAD_SIDES


def _tasks():
    from data import TASKS
    return tuple(TASKS)


SCHEMA: dict[str, Allowed] = {
    "seed": NONNEG_INT,
    "device": Allowed("str", choices=DEVICES),
    "results_dir": Allowed("str"),
    # data: the keys every task has; a task's own keys are in TASK_KEYS
    "data.name": Allowed("str", choices=_tasks),
    "data.seq_len": POS_INT,
    **{key: allowed for key, (_, allowed, _) in config_fields().items()},  # attention.config's fields
    "optim.name": Allowed("str", choices=OPTIMIZERS),
    "optim.lr": Allowed("float", lo=0, lo_open=True),
    "optim.weight_decay": Allowed("float", lo=0),
    "optim.schedule": Allowed("str", choices=SCHEDULES),
    "optim.warmup_steps": NONNEG_INT,
    "optim.min_lr": Allowed("float", lo=0),
    "optim.decay_steps": Allowed("int", lo=1, null=True),
    "train.steps": POS_INT,
    "train.batch_size": POS_INT,
    "train.log_every": POS_INT,
    "train.diag_every": NONNEG_INT,     # 0: no diagnostic steps
    "train.ckpt_every": NONNEG_INT,     # 0: no checkpoints
    "train.eval_batches": POS_INT,
    "train.grad_clip": Allowed("float", lo=0),   # 0: no clipping
    "train.dtype": Allowed("str", choices=("auto", *DTYPES)),
    "train.compile": Allowed("bool"),
    "train.progress": Allowed("str", choices=("auto", True, False)),
    "train.threads": Allowed("int", lo=1, null=True, choices=("auto",), number=True),  # torch CPU threads: auto (the free cores), N, null (torch's default)
    "train.z_loss": Allowed("float", lo=0),     # PaLM's z-loss coefficient on mean(log Z^2); 0: off
    "logger.name": Allowed("str", choices=LOGGERS),
}

OPTIM_KEYS = {
    "adamw": {"optim.betas": Allowed("list"), "optim.eps": Allowed("float", lo=0, lo_open=True)},
    "sgd": {"optim.momentum": Allowed("float", lo=0, hi=1, hi_open=True)},
}

LOGGER_KEYS = {
    "wandb": {"logger.mode": Allowed("str", choices=LOGGER_MODES),
              "logger.project": Allowed("str"), "logger.entity": Allowed("str", null=True)},
    "none": {},
}

# A vocabulary of 1 (chance loss ln 1 = 0) or a copy of length 0 makes every check vacuous.
TASK_KEYS = {
    "copy": {"data.vocab_size": Allowed("int", lo=2)},
    "padded_copy": {"data.vocab_size": Allowed("int", lo=2), "data.min_len": POS_INT, "data.max_len": POS_INT,
                    "data.pad_side": Allowed("str", choices=_pad_sides)},
    "two_facts": {"data.n_values": Allowed("int", lo=2), "data.n_noise": POS_INT, "data.max_copies": POS_INT,
                  "data.ordered": Allowed("bool"), "data.shared_values": Allowed("bool"),
                  "data.vocab_size": Allowed("int", lo=2, null=True)},
    "shakespeare_char": {"data.path": Allowed("str", null=True), "data.vocab_size": Allowed("int", lo=2, null=True),
                         "data.train_fraction": Allowed("float", lo=0, hi=1, lo_open=True, hi_open=True)},
    "shakespeare_lines": {"data.path": Allowed("str", null=True), "data.vocab_size": Allowed("int", lo=2, null=True),
                          "data.train_fraction": Allowed("float", lo=0, hi=1, lo_open=True, hi_open=True),
                          "data.pad_side": Allowed("str", choices=_pad_sides)},
    "python_source_char": {"data.vocab_size": Allowed("int", lo=2, null=True),
                           "data.train_fraction": Allowed("float", lo=0, hi=1, lo_open=True, hi_open=True)},
    "python_source_lines": {"data.vocab_size": Allowed("int", lo=2, null=True),
                            "data.train_fraction": Allowed("float", lo=0, hi=1, lo_open=True, hi_open=True),
                            "data.pad_side": Allowed("str", choices=_pad_sides)},
    "chichewa_char": {"data.path": Allowed("str", null=True), "data.vocab_size": Allowed("int", lo=2, null=True),
                      "data.train_fraction": Allowed("float", lo=0, hi=1, lo_open=True, hi_open=True)},
    "chichewa_lines": {"data.path": Allowed("str", null=True), "data.vocab_size": Allowed("int", lo=2, null=True),
                       "data.train_fraction": Allowed("float", lo=0, hi=1, lo_open=True, hi_open=True),
                       "data.pad_side": Allowed("str", choices=_pad_sides)},
    "bpe_text": {"data.vocab_size": Allowed("int", lo=257), "data.corpora": Allowed("list"),
                 "data.max_chars": Allowed("int", lo=1, null=True),
                 "data.train_fraction": Allowed("float", lo=0, hi=1, lo_open=True, hi_open=True)},
}

EXP_KEYS = {"exp.name": Allowed("str"), "exp.claim": Allowed("str", null=True),
            "exp.figure_metric": Allowed("str", null=True)}


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


def validate_known_keys(cfg: dict, keys: dict) -> None:
    """A key nobody reads (`+train.step=100`) is an error, not a silent no-op."""
    for key in leaves({k: v for k, v in cfg.items() if k not in ("exp", "hydra")}):
        if key not in keys:
            raise unknown_key(key, keys, cfg)
    spec = cfg.get("exp") or {}
    for f in spec:
        if f not in EXP_FIELDS:
            raise unknown_key(f"exp.{f}", [f"exp.{x}" for x in EXP_FIELDS])
    for node in ("control", "floor"):
        for f in spec.get(node) or {}:
            if f not in CONTROL_FIELDS:
                raise unknown_key(f"exp.{node}.{f}", [f"exp.{node}.{x}" for x in CONTROL_FIELDS])


def get(cfg: dict, key: str):
    d = cfg
    for part in key.split("."):
        if not isinstance(d, dict) or part not in d:
            raise ConfigError(f"{key} is missing from the config")
        d = d[part]
    return d


def keys_for(cfg: dict) -> dict[str, Allowed]:
    """The keys this config must have: the common ones and those of its task, optimizer, logger."""
    out = {**SCHEMA, **EXP_KEYS}
    for key, table in (("data.name", TASK_KEYS), ("optim.name", OPTIM_KEYS), ("logger.name", LOGGER_KEYS)):
        name = get(cfg, key)
        validate_value(key, name, out[key])
        out.update(table[name])
    return out


def validate_value(key: str, value, allowed: Allowed):
    if not allowed.ok(value):
        raise ConfigError(not_allowed(key, value, allowed))


def _cross(cfg: dict):
    """Rules over several keys; each message names every key it involves."""
    try:  # the model's own rules (head widths, KV heads, what SDPA can express), as the library checks them
        ModelConfig.from_dict({**cfg["model"], "vocab_size": 2})
    except ValueError as e:
        raise ConfigError(str(e)) from None
    d = cfg["data"]
    o = cfg["optim"]
    if o["min_lr"] > o["lr"]:
        raise ConfigError(f"optim.min_lr={show(o['min_lr'])} is above optim.lr={show(o['lr'])}")
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
    if cfg["device"] == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise ConfigError("device='cuda' but no CUDA device is available: use device=auto or cpu")


def validate(cfg: dict) -> None:
    """Raise ConfigError (one line) for the first value the schema does not allow."""
    keys = keys_for(cfg)
    validate_known_keys(cfg, keys)
    for key, spec in keys.items():
        validate_value(key, get(cfg, key), spec)
    _cross(cfg)


def markdown() -> str:
    """Every key: what it allows, and for the model's keys what it does (attention.config)."""
    rows = ["| key | allowed | what |", "|---|---|---|"]
    docs = {key: doc for key, (_, _, doc) in config_fields().items()}
    everything = {**SCHEMA}
    for table in (TASK_KEYS, OPTIM_KEYS, LOGGER_KEYS):
        for name, keys in table.items():
            for k, spec in keys.items():
                everything.setdefault(f"{k} ({name})" if k in everything else k, spec)
    for key, spec in everything.items():
        rows.append(f"| `{key}` | {spec.allowed()} | {docs.get(key, '')} |")
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
