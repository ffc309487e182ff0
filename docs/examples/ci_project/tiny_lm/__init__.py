from tiny_lm.model import TinyLM, build

__all__ = ["TinyLM", "build"]
