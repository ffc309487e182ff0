"""Attention written without a softmax or SDPA call: products through torch.einsum read as the
matmuls they are, and a hand-made normalisation (exp and a sum, with or without the row maximum
taken off; or a division by the sum alone) recognised between the two products of an attention
call: q k^T, then weights @ v, where the weights' rows (or columns) sum to one or came out of an
exp of the scores. The probe (probes.py) builds its calls from what this module reads."""
import torch

ROW_SUM_SEEN = 1e-2   # weights whose rows sum to 1 within this (float16 included) are normalised weights


def einsum_operands(args, kwargs):
    """(equation, [operands]) of a torch.einsum call (operands as varargs or one list)."""
    eq = args[0] if args else kwargs.get("equation")
    ops = list(args[1:])
    if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
        ops = list(ops[0])
    return eq, ops


def as_matmul(eq, a, b, out):
    """An einsum of two operands that is a batched matmul, as (A (.., M, K), B (.., K, N), its
    output (.., M, N)); None for any other einsum. `b h i d, b h j d -> b h i j` gives (q, k^T,
    scores); `b h i j, b h j d -> b h i d` gives (weights, v, out). An operand without one of the
    output's batch letters (keys shared across heads) gets a dimension of size 1 there. An output
    whose letters are a permutation of that order (XLNet's `b n i j, j b n d -> i b n d`: the row
    letter first) is read with its batch letters, each in both operands, moved in front."""
    letters = _matmul_letters(eq)
    if letters is None:
        return None
    s0, s1, o, batch, m, n, k = letters
    return _arrange(a, s0, batch, m, k), _arrange(b, s1, batch, k, n), _arrange(out, o, batch, m, n)


def output_order(eq) -> list[int] | None:
    """The permutation that puts a matmul-like einsum's output in the order (batch..., rows, cols)
    as_matmul reads it (the rows: the letter only the first operand has, the columns: only the
    second's): [0, 2, 1, 3] for 'bqhd,bkhd->bqhk', whose scores lie (B, T_q, H, T_k). None for
    another einsum, or where the output is in that order already."""
    letters = _matmul_letters(eq)
    if letters is None:
        return None
    o, batch, m, n = letters[2:6]
    order = [o.index(x) for x in batch + m + n]
    return None if order == sorted(order) else order


def _matmul_letters(eq):
    """(first operand's letters, second's, output's, batch letters, row, column, summed) of an einsum
    of two operands that is a batched matmul; None otherwise."""
    if not isinstance(eq, str) or "." in eq or "->" not in eq:
        return None
    lhs, o = eq.replace(" ", "").split("->")
    parts = lhs.split(",")
    if len(parts) != 2 or len(o) < 2:
        return None
    s0, s1 = parts
    summed = [c for c in s0 if c in s1 and c not in o]
    if len(summed) != 1 or set(s0) - set(o) - set(summed) or set(s1) - set(o) - set(summed):
        return None   # not one contracted letter, or a letter summed within one operand
    m, n = o[-2], o[-1]
    if m not in s0 or m in s1 or n not in s1 or n in s0:
        rows, cols = [x for x in o if x in s0 and x not in s1], [x for x in o if x in s1 and x not in s0]
        if len(rows) != 1 or len(cols) != 1 or any(x not in s0 or x not in s1 for x in o if x not in rows + cols):
            return None
        m, n = rows[0], cols[0]
    batch = "".join(x for x in o if x not in (m, n))
    return s0, s1, o, batch, m, n, summed[0]


def _arrange(t, letters, batch, row, col):
    """t with its dims in the order batch + (row, col); a batch letter it lacks becomes size 1."""
    have = "".join(x for x in batch if x in letters)
    t = torch.einsum(f"{letters}->{have}{row}{col}", t)
    for i, x in enumerate(batch):
        if x not in letters:
            t = t.unsqueeze(i)
    return t


def normalised_dim(w: torch.Tensor) -> int | None:
    """-1 when w's rows sum to 1 (finite entries), -2 when its columns do (normalised over the
    queries), else None: not a matrix of attention weights."""
    if not w.is_floating_point() or w.dim() < 2:
        return None
    w = w.detach().double()
    for dim in (-1, -2):
        s = w.sum(dim)
        s = s[torch.isfinite(s)]
        if s.numel() and bool(((s - 1).abs() <= ROW_SUM_SEEN).all()):
            return dim
    return None


SCORES_FIT = 1e-2   # an exp's input is the scores when c q k^T + a constant per row leaves this much of it


def fitted_scale(exp_in: torch.Tensor, prod: torch.Tensor, visible: torch.Tensor, fit: float | None = None,
                 dim: int = -1) -> float | None:
    """c in exp_in = c q k^T + (a constant per row) at the visible entries: the median over rows of
    the least-squares slope (a row maximum taken off before the exp is such a constant; dim -2: a
    constant per column, a softmax over the queries). fit: None where the residual of that fit is
    more than `fit` of exp_in's spread about its row means (an exp of something else: a linear
    attention's decay gates)."""
    x, y = prod.detach().double(), exp_in.detach().double()
    vis = visible.expand_as(y) & torch.isfinite(y) & torch.isfinite(x)
    if dim == -2:
        x, y, vis = x.transpose(-2, -1), y.transpose(-2, -1), vis.transpose(-2, -1)
    x, y = torch.where(vis, x, 0.0), torch.where(vis, y, 0.0)
    n = vis.sum(-1, keepdim=True)
    ok = n[..., 0] >= 2
    if not ok.any():
        return None
    mx = (x * vis).sum(-1, keepdim=True) / n.clamp_min(1)
    my = (y * vis).sum(-1, keepdim=True) / n.clamp_min(1)
    xc, yc = (x - mx) * vis, (y - my) * vis
    den = (xc * xc).sum(-1)
    keep = ok & (den > 1e-24)
    if not keep.any():
        return None
    slope = (xc * yc).sum(-1)[keep] / den[keep]
    if fit is not None:
        spread = float((yc[keep] ** 2).sum())
        if spread == 0 or float(((yc[keep] - slope[:, None] * xc[keep]) ** 2).sum()) > fit ** 2 * spread:
            return None
    return float(slope.median())
