"""A tqdm bar per run (step, loss, tokens/s); silent when stderr is not a TTY (CI logs)."""
import sys

from tqdm import tqdm


class Progress:
    def __init__(self, total: int, desc: str, enabled: bool):
        self.bar = tqdm(total=total, desc=desc, disable=not enabled, leave=False, dynamic_ncols=True)
        self.last = 0

    def update(self, step: int, row: dict, tokens_per_s: float):
        self.bar.update(step + 1 - self.last)
        self.last = step + 1
        loss = row.get("loss/train")
        self.bar.set_postfix(loss=f"{loss:.3f}" if loss is not None else "-", tok_s=f"{tokens_per_s:,.0f}")

    def close(self):
        self.bar.close()


def progress_factory(cfg: dict) -> Progress:
    setting = cfg["train"]["progress"]
    enabled = sys.stderr.isatty() if setting == "auto" else bool(setting)
    return Progress(cfg["train"]["steps"], cfg["exp"]["name"], enabled)
