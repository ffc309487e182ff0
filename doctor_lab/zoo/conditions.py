"""Conditions a trained model has and a random-init zoo model may not: before a fail or warn is
called a new finding it is rerun under each (doctor_lab/zoo/confirm.py). A row that passes under
one needs what that condition takes away, and says so (`needs`).

A condition rebuilds the model (seeded), may change it (`prepare`), and runs the doctor's check
with its own dtype and input seed. `float32` is the row as it ran (a rerun that passes means it
did not reproduce)."""
from dataclasses import dataclass, field
from typing import Callable

from doctor_lab.report.triage import outcome


def _nonzero_pad_rows(model, cfg) -> str:
    """Every embedding row that is all zeros because it is a padding row (`padding_idx`, or the
    config's pad_token_id in the input embedding) gets values like the other rows' (a trained
    checkpoint's pad row need not be zero). Returns what it changed ('' when nothing was zero)."""
    import torch
    gen = torch.Generator().manual_seed(7)
    changed = []
    embs = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Embedding)}
    pad = getattr(getattr(cfg, "get_text_config", lambda: cfg)(), "pad_token_id", None)
    inp = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    for name, m in embs.items():
        rows = {m.padding_idx} if m.padding_idx is not None else set()
        if m is inp and isinstance(pad, int) and 0 <= pad < m.num_embeddings:
            rows.add(pad)
        for i in sorted(r % m.num_embeddings for r in rows):
            w = m.weight.data
            if bool((w[i] == 0).all()):
                std = float(w.float().std()) or 0.02
                w[i] = (torch.randn(w.shape[1], generator=gen) * std).to(w.dtype)
                changed.append(f"{name or 'embedding'}[{i}]")
    return ", ".join(changed)


def _no_pad_token(model, cfg) -> str:
    """The doctor pads with the config's pad_token_id where there is one; without it the padded
    positions keep ordinary token ids (a tokenizer that pads with eos, or any id the model is not
    told about): only the attention mask marks them."""
    changed = []
    for c in {id(x): x for x in (model.config, getattr(model.config, "get_text_config", lambda: None)())
              if x is not None}.values():
        if getattr(c, "pad_token_id", None) is not None:
            changed.append(f"pad_token_id {c.pad_token_id} -> None")
            c.pad_token_id = None
    return "; ".join(changed)


@dataclass(frozen=True)
class Condition:
    name: str
    what: str              # what the rerun changes
    needs: str             # what a row that passes under it needs (its label)
    seed: int = 0          # the model's init seed and the doctor's input seed
    dtype: str = "float32"
    prepare: Callable | None = field(default=None, compare=False)  # (model, cfg) -> what it changed ('' = n/a)


CONDITIONS = (
    Condition("float32", "the row rerun as it ran (float32, seed 0)", "not reproducible: passes on a rerun"),
    Condition("float64", "float64 weights and inputs", "float32 rounding: passes in float64", dtype="float64"),
    Condition("seed1", "another seed (init and inputs)", "random-init artifact: seed 0 only", seed=1),
    Condition("pad_row", "a non-zero pad embedding row", "random-init artifact: needs a zero pad row",
              prepare=_nonzero_pad_rows),
    Condition("pad_id", "pads holding an ordinary token id (no pad_token_id)",
              "needs the pads to hold the pad token id", prepare=_no_pad_token),
)
BY_NAME = {c.name: c for c in CONDITIONS}


def needs(row: dict, reruns: dict[str, dict]) -> list[str]:
    """The labels of the conditions under which a flagged row (fail or warn) passes."""
    if outcome(row) not in ("fail", "warn"):
        return []
    return [BY_NAME[n].needs for n in BY_NAME if n in reruns and outcome(reruns[n]) == "pass"]
