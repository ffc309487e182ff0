"""Outputs that cannot show what the attention does. An output projection zero at init (nanochat,
ReZero, muP-style inits) makes every position's output its own token's alone: a mask that lets a
query see the next key moves nothing, and a black-box check would pass without a look. Measured,
never read from names: a change of position 0's input moves no later output. The doctor then fills
its own copy's all-zero weight matrices with seeded noise of the model's own weight scale, so the
checks look at what the attention computes; where nothing is zero to fill, the outputs are said
insensitive and the checks that compare them are inconclusive, never a pass."""
import torch


def moves_later_outputs(ctx, x, y) -> bool:
    """A new input at position 0 (every row) moves some output at positions 1..T-1."""
    x2 = x.clone()
    new = ctx.sample(k=17)[:, 0]
    if not x.is_floating_point():   # token ids: make sure each row's token 0 really changes
        vocab = getattr(ctx.adapter, "vocab_size", None) or int(x.max()) + 2
        new = torch.where(new == x[:, 0], (new + 1) % vocab, new)
    x2[:, 0] = new
    return not torch.equal(ctx.run(x2)[:, 1:], y[:, 1:])


def _matrices(module):
    return [(n, p) for n, p in module.named_parameters() if p.dim() >= 2 and p.is_floating_point()]


def fill_zero_matrices(module, seed: int, gates: bool = False) -> list[str]:
    """Fill every all-zero weight matrix of `module` (the doctor's copy) with normal noise at the
    median std of its other matrices; the names filled. `gates`: the all-zero vectors and scalars
    instead (a LayerScale's gamma, a zero-initialised gate: x-transformers' use_layerscale), for
    where filling the matrices left the outputs still."""
    mats = _matrices(module)
    zero = [(n, p) for n, p in module.named_parameters()
            if p.is_floating_point() and (p.dim() < 2) == gates and not p.detach().any()]
    if not zero:
        return []
    scales = [float(p.detach().float().std()) for _, p in mats if p.detach().any() and p.numel() > 1]
    std = float(torch.tensor(scales).median()) if scales else 0.02
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in zero:
            p.copy_((torch.randn(p.shape, generator=gen) * std).to(p.device, p.dtype))
    return [n for n, _ in zero]
