"""A run's record: what one run dir holds (summary.json, metrics.csv, perf.csv, attn_weights.npz),
written by the trainer's runner and read back by the report and the notebooks.

No torch, no wandb here: the report reads records without loading either.
"""
import csv
import hashlib
import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from attention.config import defaults
from experiments.io import load_attn_weights
from experiments.layout import ATTN_WEIGHTS, METRICS, SUMMARY


def error_message(e: BaseException) -> str:
    """One line for summary.json's `error`: the exception's type and the first line of its text."""
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"


# keys that do not change what is trained: two configs differing only here share a control. The
# thread count changes only float summation order (summary.json's env records it), and leaving it
# out keeps every hash from before it was a key
NOT_HASHED = ("exp", "logger", "results_dir")
NOT_HASHED_TRAIN = ("progress", "ckpt_every", "threads")


def _same(a, b) -> bool:
    return a == b and type(a) is type(b)  # 1 is not true, 1.0 is not 1 in a config


def _without_defaults(d: dict, declared: dict) -> dict:
    """d less the keys at their declared default (nested dicts alike)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and isinstance(declared.get(k), dict):
            out[k] = _without_defaults(v, declared[k])
        elif not (k in declared and _same(v, declared[k])):
            out[k] = v
    return out


def config_hash(cfg: dict) -> str:
    """12 hex digits of everything that shapes training (controls and checkpoints are keyed by it).
    A model key at attention.config's declared default is left out, as if it were not there: a
    new field with a default leaves every existing hash, and so every cached control, as it was."""
    c = {k: v for k, v in cfg.items() if k not in NOT_HASHED}
    c["train"] = {k: v for k, v in c["train"].items() if k not in NOT_HASHED_TRAIN}
    if isinstance(c.get("model"), dict):
        c["model"] = _without_defaults(c["model"], defaults()["model"])
    return hashlib.sha256(json.dumps(c, sort_keys=True).encode()).hexdigest()[:12]


def flatten(d: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists as JSON text (one table cell)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, list):
            out[key] = json.dumps(v)
        else:
            out[key] = v
    return out


def read_rows(path) -> list[dict]:
    """A wide CSV (metrics.csv, perf.csv) as one dict per row: floats, None where empty; [] if absent."""
    path = Path(path)
    if not path.exists():
        return []
    with open(path) as f:
        return [{k: (float(v) if v != "" else None) for k, v in r.items()} for r in csv.DictReader(f)]


def rows_frame(rows: list[dict]):
    """Rows as a pandas DataFrame, `step` as integers (as metrics.csv writes it)."""
    import pandas as pd
    df = pd.DataFrame(rows)
    if "step" in df.columns and len(df) and df["step"].notna().all():
        df["step"] = df["step"].astype(int)
    return df


def read_attn_weights(run_dir):
    """{step: {layer: (h, T, T) float16 array}} of example 0 at each diagnostic step, or None."""
    p = Path(run_dir) / ATTN_WEIGHTS
    if not p.exists():
        return None
    try:
        return load_attn_weights(p)
    except (OSError, ValueError, KeyError):
        return None


# command-line overrides that say nothing about what a run trained or how it was judged
NOT_VARIED = ("exp", "seed", "results_dir", "logger", "data", "hydra", "train.progress", "train.ckpt_every")


@dataclass
class RunRecord:
    """One run: the fields of its summary.json, and where it lies."""
    exp: str
    status: str                     # completed | diverged | error
    role: str | None = None         # failure | control | baseline
    claim: str | None = None
    seed: int | None = None
    steps_done: int = 0
    final: dict = field(default_factory=dict)      # eval metrics at the end (+ exp.measures)
    nonfinite: dict | None = None   # {step, module, where} of the first NaN/inf
    error: str | None = None
    params: dict = field(default_factory=dict)
    config_hash: str | None = None
    device: str | None = None
    # what the numbers depend on beyond the config: {torch, threads, python, gpu}. The thread
    # count changes float summation order, and with it where a marginal run leaves a plateau.
    env: dict = field(default_factory=dict)
    wall_s: float | None = None
    cpu_s: float | None = None
    perf: dict = field(default_factory=dict)
    context: dict = field(default_factory=dict)    # names check expressions may use: ln_V, V, d_k, ...
    config: dict = field(default_factory=dict)     # the whole resolved config
    control: dict | None = None     # failures: the control's {name, dir, status, final, config_hash, ...}
    verdict: dict | None = None     # failures and baselines: judging.verdict.evaluate's result
    expected_error: bool | None = None
    floor: dict | None = None       # text versions: the no-attention floor's {name, dir, status, final, config_hash}
    # a shared control: the final metrics measured after its W&B run closed, on its saved weights,
    # for a later experiment that reuses it (runner.measure_cached); only summary.json has them
    measured_later: list | None = None
    # a control or floor: the experiment whose run trained it (every later one reuses it from the cache)
    trained_for: str | None = None
    # where it was read from (not in summary.json)
    dir: Path | None = field(default=None, compare=False)
    id: str = field(default="", compare=False)     # the run dir as the report shows it
    control_run: "RunRecord | None" = field(default=None, compare=False, repr=False)

    SUMMARY_FIELDS = ()  # set below: the fields summary.json holds, in order

    def to_summary(self) -> dict:
        """summary.json's content; control, verdict, expected_error and floor only where set."""
        out = {k: getattr(self, k) for k in self.SUMMARY_FIELDS}
        for k in ("control", "verdict", "expected_error", "floor", "measured_later", "trained_for"):
            if out[k] is None:
                del out[k]
        return out

    @classmethod
    def from_summary(cls, d: dict, run_dir=None, id: str = "") -> "RunRecord":
        known = {k: v for k, v in d.items() if k in cls.SUMMARY_FIELDS}
        return cls(**known, dir=Path(run_dir) if run_dir is not None else None, id=id)

    @classmethod
    def read(cls, run_dir, id: str = "") -> "RunRecord":
        """summary.json of run_dir; raises OSError / json.JSONDecodeError when unreadable."""
        return cls.from_summary(json.loads((Path(run_dir) / SUMMARY).read_text()), run_dir, id)

    @property
    def variant(self) -> str:
        """What was trained, seed aside: runs of one variant differ only by seed."""
        if not self.config.get("train"):
            return self.config_hash or ""
        return config_hash({**self.config, "seed": None})

    @property
    def is_control(self) -> bool:
        return self.role == "control"

    @property
    def reproduced(self) -> bool:
        return bool((self.verdict or {}).get("reproduced"))

    def metrics(self) -> list[dict]:
        """metrics.csv: one dict per logged step."""
        return read_rows(self.dir / METRICS)

    def metrics_frame(self):
        return rows_frame(self.metrics())

    def attn_weights(self):
        return read_attn_weights(self.dir)

    def given_overrides(self) -> list[str]:
        """The command line's overrides of this run (Hydra's .hydra/overrides.yaml in its dir) that
        change what it trained or the thresholds it was judged by: a sweep's report names what it
        varied (`model.attention.d_k=16`). The data is left out: text runs have their own section."""
        p = Path(self.dir or ".") / ".hydra" / "overrides.yaml"
        if not p.exists():
            return []
        import yaml
        out = []
        for o in yaml.safe_load(p.read_text()) or []:
            key = str(o).lstrip("+~").split("=", 1)[0]
            if not any(key == k or key.startswith((k + ".", k + "/")) for k in NOT_VARIED) \
                    or key.startswith("exp.checks."):
                out.append(str(o).lstrip("+"))
        return out

    def title(self) -> str:
        """What its figure is titled, and the report labels a one-run experiment: the experiment
        and the overrides it was trained with (`no_scaling [train.steps=6]`)."""
        given = self.given_overrides()
        return f"{self.exp} [{', '.join(given)}]" if given else self.exp


RunRecord.SUMMARY_FIELDS = tuple(f.name for f in fields(RunRecord) if f.name not in ("dir", "id", "control_run"))
