"""This project's LM and attention layer as doctor targets, and `self:` (conf/ composed with
overrides). Composing conf/ needs Hydra: it is imported here, lazily, only for `self:`."""
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

from attention_doctor.adapters import Adapter, TargetError, Unsupported


class ProjectLM(Adapter):
    """attention.TransformerLM: mask = its key_padding_mask; positions: a uniform offset is its
    `start`; positions counted from each row's first real token are its model.pad_positions=
    from_first_token (the model's own switch for positions from the mask); other positions it
    cannot take."""
    kind = "lm"

    def __init__(self, model, name=""):
        super().__init__(model, name or "attention.TransformerLM")
        self.vocab_size = model.cfg.vocab_size
        self.max_len = model.cfg.block_size if model.pos_emb is not None else None

    def forward(self, x, mask=None, positions=None):
        if positions is None:
            return self.module(x, key_padding_mask=mask)
        start = positions[:, :1]
        if bool((positions == start + torch.arange(x.shape[1], device=x.device)).all()) and bool((start == start[0]).all()):
            return self.module(x, key_padding_mask=mask, start=int(start[0, 0]))
        if mask is not None and bool((positions == (mask.long().cumsum(-1) - 1).clamp(min=0)).all()):
            cfg, old = self.module.cfg, self.module.cfg.pad_positions
            cfg.pad_positions = "from_first_token"
            try:
                return self.module(x, key_padding_mask=mask)
            finally:
                cfg.pad_positions = old
        raise Unsupported("needs per-row position ids (the LM takes a start or positions from its mask)", "no_positions")

    @property
    def implementation(self):
        return _implementation(self.module)

    def prefill(self, x):
        from attention.mha import KVCache
        cache = KVCache(self.module.cfg.n_layers)
        return cache, self.module(x, cache=cache)

    def step(self, state, x):
        return state, self.module(x, cache=state)

    def embedding(self):
        return self.module.tok_emb

    def paths(self):
        return ["explicit", "sdpa"] if not self.module.cfg.attn.sdpa_limits() else []

    @contextmanager
    def use_path(self, name):
        cfgs = list({id(a.cfg): a.cfg for a in _layers(self.module)}.values())
        old = [c.backend for c in cfgs]
        for c in cfgs:
            c.backend = name
        try:
            yield
        finally:
            for c, b in zip(cfgs, old):
                c.backend = b


class ProjectLayer(Adapter):
    """attention.MultiHeadAttention as self-attention: forward(x, x, x, is_causal=causal)."""
    kind = "layer"

    def __init__(self, layer, name="", causal=True):
        super().__init__(layer, name or "attention.MultiHeadAttention")
        self.causal = causal
        self.d_model = layer.cfg.d_model

    def forward(self, x, mask=None, positions=None):
        if positions is not None:
            raise Unsupported("needs positions (a layer takes none)", "no_positions")
        return self.module(x, x, x, is_causal=bool(self.causal), key_padding_mask=mask)[0]

    @property
    def implementation(self):
        return _implementation(self.module)

    def paths(self):
        return ["explicit", "sdpa"] if not self.module.cfg.sdpa_limits() else []

    use_path = ProjectLM.use_path


def adapt_project(obj, **kw):
    from attention.lm import TransformerLM
    if isinstance(obj, TransformerLM):
        return ProjectLM(obj, **kw)
    return ProjectLayer(obj, **kw)


def _layers(module) -> list:
    """The MultiHeadAttention layers of an LM, or the layer itself."""
    return list(module.attentions) if hasattr(module, "attentions") else [module]


def _implementation(module) -> str:
    """model.attention.backend as it resolves (auto: the fused kernel where it can compute the layer)."""
    cfg = _layers(module)[0].cfg
    return f"{'sdpa' if cfg.use_sdpa else 'explicit'} (model.attention.backend={cfg.backend})"


def clone_root(start: Path | None = None) -> Path | None:
    """The clone of this project at or above `start` (default: the working directory): the first
    directory holding conf/config.yaml and experiments/config.py. `self:` needs it; the
    `attention-doctor` console script does not have the clone on sys.path."""
    start = (start or Path.cwd()).resolve()
    for d in (start, *start.parents):
        if (d / "conf" / "config.yaml").is_file() and (d / "experiments" / "config.py").is_file():
            return d
    return None


def build_self(overrides: list[str], seed: int = 0):
    """This project's LM from conf/ with Hydra overrides (`self:model.attention.merge=no_transpose`),
    random weights from `seed`. A bad override: TargetError with Hydra's one line."""
    root = clone_root()
    if root is None:
        raise TargetError("self: needs a clone of attention-failure-suite: run it from inside the clone "
                          f"(no conf/config.yaml and experiments/ at or above {Path.cwd()})")
    if str(root) not in sys.path:   # the console script's sys.path has its own bin/, not the clone
        sys.path.insert(0, str(root))
    try:
        from experiments.config import compose
    except ImportError as e:
        raise TargetError(f"self: needs this project's experiments package and Hydra: pip install -r "
                          f"requirements.txt in the clone ({e})") from None
    try:
        cfg = compose(overrides)
    except Exception as e:  # noqa: BLE001 -- Hydra's errors (an unknown key, a bad value): TargetError (exit 2, Hydra's one line)
        raise TargetError(f"self: {' '.join(overrides)}: {str(e).splitlines()[0]}") from None
    from attention.lm import ModelConfig, TransformerLM
    model_cfg = {**cfg["model"], "vocab_size": cfg["data"].get("vocab_size") or 64}
    try:
        mc = ModelConfig.from_dict(model_cfg)
    except ValueError as e:
        raise TargetError(f"self: {e}") from None
    torch.manual_seed(seed)
    return TransformerLM(mc).eval()
