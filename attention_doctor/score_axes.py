"""Which axis of a traced call's scores holds the queries, measured, never assumed to be (B, H, T_q,
T_k): an einsum may leave them (B, T_q, H, T_k) (latent attention written as 'bshd,bthd->bsht').
In a causal forward a new last token in row 0 changes, among the scores on the earlier keys, only
query T-1's in row 0, in every head: the query axis is the one whose changed entries sit at index
T-1 alone, the batch axis the one where they sit at row 0 alone. A call whose scores show that
pattern on an axis other than the one before the keys is read with that axis as its queries; its
q, k and v, read in the assumed layout, are dropped (the checks that need them say so)."""
import torch


def query_axis(s1: torch.Tensor, s2: torch.Tensor, T: int) -> int | None:
    """The query axis (negative, keys last) of scores s1 of a plain batch and s2 of the same batch
    with row 0's last token changed; None where no axis shows the pattern, or more than one does."""
    if s1.shape != s2.shape or s1.dim() < 3 or s1.shape[-1] != T:
        return None
    a, b = s1[..., : T - 1], s2[..., : T - 1]
    changed = (a != b) & ~(torch.isnan(a) & torch.isnan(b))
    if not bool(changed.any()):
        return None
    found = []
    for axis in range(-s1.dim(), -1):
        if s1.shape[axis] != T:
            continue
        where = changed.movedim(axis, 0).flatten(1).any(1).nonzero().flatten().tolist()
        if where == [T - 1]:
            found.append(axis)
    return found[0] if len(found) == 1 else None


def ambiguous(scores: torch.Tensor, T: int) -> list[int]:
    """The axes of `scores` (keys last) that could hold the queries: those of length T before the keys.
    More than one: the layout must be measured, and where it cannot be, it is not read."""
    return [a for a in range(-scores.dim(), -1) if scores.shape[a] == T]


def unmeasured(call) -> str:
    """Why the call's layout is not read (call.extra["layout_unmeasured"]), said once."""
    shape = tuple(call.scores.shape)
    axes = ambiguous(call.scores, shape[-1])
    call.extra["layout_unmeasured"] = (f"scores {shape}: axes {axes} are as long as the sequence, "
                                       "and which holds the queries could not be measured")
    return call.extra["layout_unmeasured"]


def relaid(call, axis: int):
    """The call read with `axis` of its scores as the queries (moved before the keys); q, k, v and
    out dropped, since they were read in the layout assumed before."""
    for name in ("scores", "weights", "visible"):
        t = getattr(call, name)
        if isinstance(t, torch.Tensor) and t.dim() == call.scores.dim():
            setattr(call, name, t.movedim(axis, -2))
    call.q = call.k = call.v = call.out = None
    call.scale = None
    call.extra["query_axis_measured"] = axis
    return call
