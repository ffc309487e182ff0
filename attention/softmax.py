"""Three ways to turn scores into weights; only the first is right."""
import torch


def softmax_stable(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """exp(x - max) / sum: the max subtraction keeps every exp in (0, 1]."""
    return torch.softmax(x, dim=dim)


def softmax_naive(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """exp(x) / sum exp(x) as the formula reads: exp overflows above ~88.7 in float32
    (~11.09 in float16), inf / inf is NaN."""
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)


def normalize_by_sum(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """x / sum(x): rows sum to 1 but weights can be negative (or blow up when the sum
    nears 0), so the output leaves the convex hull of the values."""
    return x / x.sum(dim=dim, keepdim=True)


SOFTMAXES = {"stable": softmax_stable, "naive": softmax_naive, "sum": normalize_by_sum}
