"""The doctor's verdict does not depend on the caller's random state: what a target draws itself
is seeded from examine's seed (its own init, a sampled noise), and the caller's RNG streams are
restored after."""
import torch
import torch.nn as nn

from attention_doctor import examine


class NoisyInEval(nn.Module):
    """A causal LM that adds noise in eval too (a bug eval_dropout catches): its size depends on the draws."""

    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(32, 16), nn.Linear(16, 32)

    def forward(self, ids):
        x = self.emb(ids)
        x = x.cumsum(1) / torch.arange(1, ids.shape[1] + 1)[:, None]   # causal mixing
        return self.head(x + 1e-3 * torch.rand(()) * torch.randn_like(x))


def test_the_targets_own_draws_are_seeded_and_the_callers_state_restored():
    m = NoisyInEval()
    rows = []
    for caller_seed in (1, 2):
        torch.manual_seed(caller_seed)
        before = torch.random.get_rng_state()
        r = examine(m, checks=["eval_dropout"])
        assert torch.equal(torch.random.get_rng_state(), before)
        rows.append(r["eval_dropout"])
    assert rows[0].failed and rows[0].cause == rows[1].cause
    assert rows[0].measured == rows[1].measured > 0
    assert examine(m, checks=["eval_dropout"], seed=1)["eval_dropout"].measured != rows[0].measured
