"""The styles bed (doctor_lab/styles): its records are complete and name real checks and causes,
every command-line target resolves, and every planted bug is really there, measured directly from
the model's outputs, without the doctor: later tokens move earlier outputs (the leaks), a cached
step differs from the full forward (the cache bugs), left padding moves the real tokens' outputs
(an ignored mask: two rows that differ only in their padding) or turns them non-finite (a -inf fill), large scores turn the outputs non-finite
(naive softmax) or leak (a finite fill), another row moves row 0 (packed sequences), and where the
bug has no behavioural signature of its own at init (a missing scale, a masked diagonal, weights
that go negative) the outputs differ from the healthy twin's (the same weights). Each healthy
style holds every one of these that its interface can be asked. Forward only, under no_grad (flex
attention on CPU has no backward).

What today's doctor says of these cases is not asserted here (it fails most of them; issue 44):
`python -m doctor_lab.styles.measure` measures it and writes doctor_lab/styles/BASELINE.md."""
import pytest
import torch
import torch.nn as nn

import doctor_lab.styles as S
from attention_doctor.checks import REGISTRY
from attention_doctor.checks.record import COMMON_CAUSES
from attention_doctor.targets import resolve
from doctor_lab.styles._common import VOCAB

B, T, CUT, PAD, NEW = 2, 16, 8, 5, 3
AMP = 300.0    # every linear weight times this: scores near 1e4..1e5, as amplified_logits aims for
TOL = 1e-5     # relative: the doctor's own agreement tolerance
PLANTED = [c for c in S.CASES if c.planted and c.bug]
HEALTHY = [c for c in S.CASES if c.bug is None]


@pytest.fixture(autouse=True)
def forward_only():
    with torch.no_grad():
        yield


def tokens(seed=0):
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def plain(style, model, x):
    mod = S.STYLES[style]
    return mod.plain(model, x) if hasattr(mod, "plain") else model(x)


def rel(a, b) -> float:
    """max |a - b| / max |b|; inf where a is not finite."""
    return float((a - b).abs().max() / b.abs().max()) if bool(torch.isfinite(a).all()) else float("inf")


# -- the direct measurements: > TOL means the bug is there --------------------------------------

def leak(style, model):
    """Earlier outputs moved by replacing the tokens from CUT on."""
    x = tokens()
    later = x.clone()
    later[:, CUT:] = (x[:, CUT:] + 1) % VOCAB
    return rel(plain(style, model, later)[:, :CUT], plain(style, model, x)[:, :CUT])


def amplified(model):
    for m in model.modules():
        if isinstance(m, nn.Linear):
            m.weight.mul_(AMP)
    return model


def amplified_leak(style, model):
    return leak(style, amplified(model))


def amplified_nonfinite(style, model):
    return 0.0 if bool(torch.isfinite(plain(style, amplified(model), tokens())).all()) else float("inf")


def left_padded(style, model):
    """The real tokens' outputs of two left-padded rows that differ only in what the padding holds
    (after a plain call, a user's first): a mask that is honoured makes them equal."""
    x, keep = tokens(), torch.ones(B, T, dtype=torch.bool)
    plain(style, model, x)
    x[1, PAD:] = x[0, PAD:]
    x[1, :PAD] = (x[0, :PAD] + 1) % VOCAB
    keep[:, :PAD] = False
    out = S.STYLES[style].padded(model, x, keep)[:, PAD:]
    return out[1], out[0]


def padding_moves(style, model):
    return rel(*left_padded(style, model))


def padding_raises(style, model):
    """A padded batch after a plain call at another length (the doctor's unpadded row, then the
    left-padded one) raises: flex_attention's check that a kept BlockMask matches its lengths."""
    x, keep = tokens(), torch.ones(B, T, dtype=torch.bool)
    keep[:, :PAD] = False
    plain(style, model, x[:, PAD:])
    try:
        S.STYLES[style].padded(model, x, keep)
    except ValueError:
        return float("inf")
    return 0.0


def padded_nonfinite(style, model):
    return 0.0 if all(bool(torch.isfinite(o).all()) for o in left_padded(style, model)) else float("inf")


def cache_gap(style, model):
    x = tokens()
    return rel(S.STYLES[style].cached(model, x, NEW), plain(style, model, x)[:, -NEW:])


def cache_raises(style, model):
    try:
        cache_gap(style, model)
    except ValueError:   # flex_attention's check that a BlockMask matches the lengths it is used at
        return float("inf")
    return 0.0


def rows_mix(style, model):
    x = tokens()
    other = x.clone()
    other[1] = (x[1] + 1) % VOCAB
    return rel(plain(style, model, other)[0], plain(style, model, x)[0])


def twin_differs(style, model):
    return rel(plain(style, model, tokens()), plain(style, S.build(style, None), tokens()))


EFFECT = {   # (check, cause) a record expects -> the measurement that shows the bug without the doctor
    ("future_leak", "outputs_move"): leak,
    ("self_visibility", "own_key_masked"): twin_differs,
    ("score_scale", "too_large"): twin_differs,
    ("amplified_logits", "outside_hull"): twin_differs,
    ("amplified_logits", "row_sum"): twin_differs,
    ("amplified_logits", "nonfinite"): amplified_nonfinite,
    ("amplified_logits", "masked_key_weight"): amplified_leak,
    ("padding", "left_padding"): padding_moves,
    ("padding", "mask_ignored"): padding_moves,
    ("padding", "target_raised"): padding_raises,
    ("fully_masked_rows", "nonfinite_outputs"): padded_nonfinite,
    ("kv_cache", "new_tokens_differ"): cache_gap,
    ("kv_cache", "prefill_differs"): cache_gap,
    ("kv_cache", "target_raised"): cache_raises,
    ("batch_independence", "rows_mix"): rows_mix,
}


# -- the records -------------------------------------------------------------------------------

def test_every_style_says_for_every_catalogue_bug_whether_and_how_it_plants_it():
    assert len(S.STYLES) >= 10
    for name, mod in S.STYLES.items():
        assert not set(mod.PLANTED) & set(mod.CANNOT), name
        assert set(S.CATALOGUE) <= set(mod.PLANTED) | set(mod.CANNOT), (name, set(S.CATALOGUE) - set(mod.PLANTED) - set(mod.CANNOT))
        assert all(mod.CANNOT.values()) and all(mod.PLANTED.values()), name
        for bug in set(mod.PLANTED) - set(S.CATALOGUE):   # a style's own bug is recorded as its own
            assert name in S.BUGS[bug].styles, (name, bug)
        assert set(getattr(mod, "EXPECTS", {})) <= set(mod.PLANTED), name


def test_every_expectation_names_a_check_and_a_documented_cause_and_a_direct_measurement():
    causes = {c.name: set(c.causes) | set(COMMON_CAUSES) for c in REGISTRY}
    for case in PLANTED:
        assert case.expects, case.id
        for check, cause in case.expects:
            assert cause in causes[check], (case.id, check, cause)
            assert (check, cause) in EFFECT, (case.id, check, cause)
    for case in HEALTHY:   # a hazard of the project's own formula, documented like a bug's cause
        assert all(cause in causes[check] for check, cause in case.expects), case.id


def test_the_classic_bed_joins_the_records():
    from doctor_lab.styles import classic as doctor_styles
    classic = S.from_classic(doctor_styles)
    assert {c.style for c in classic} == set(doctor_styles.STYLES)
    assert len(classic) == len(doctor_styles.cases())
    assert ("score_scale", "") in next(c for c in classic if c.bug == "no_scaling").expects


@pytest.mark.parametrize("case", [c for c in S.CASES if c.planted], ids=lambda c: c.id)
def test_the_command_line_target_builds_the_case(case):
    """resolve() as the CLI calls it; a planted bug's model differs from the healthy one only by its bug."""
    model = resolve(case.target)
    assert isinstance(model, nn.Module) and not model.training
    healthy = S.build(case.style, None).state_dict()
    assert list(model.state_dict()) == list(healthy), case.id
    assert all(torch.equal(t, healthy[n]) for n, t in model.state_dict().items()), case.id


def test_a_bug_a_style_does_not_plant_is_refused():
    with pytest.raises(ValueError, match="does not plant 'neg_inf_fill'"):
        S.build("gpt_fast", "neg_inf_fill")
    with pytest.raises(AttributeError):
        S.gpt_fast.neg_inf_fill


# -- the bugs, measured ------------------------------------------------------------------------

@pytest.mark.parametrize("case", HEALTHY, ids=lambda c: c.id)
def test_a_healthy_style_is_causal_finite_and_consistent_through_its_own_interface(case):
    style, mod = case.style, S.STYLES[case.style]
    model = S.build(style)
    out = plain(style, model, tokens())
    assert out.shape == (B, T, VOCAB) and bool(torch.isfinite(out).all()), style
    assert leak(style, model) <= TOL
    assert rows_mix(style, model) <= TOL
    if hasattr(mod, "cached"):
        assert cache_gap(style, model) <= TOL
    if hasattr(mod, "padded"):
        assert padding_moves(style, model) <= TOL
        assert padded_nonfinite(style, model) == 0.0
    for probe in (amplified_nonfinite, amplified_leak):
        assert probe(style, S.build(style)) <= TOL, (style, probe.__name__)


@pytest.mark.parametrize("case", PLANTED, ids=lambda c: c.id)
def test_a_planted_bug_is_really_there(case):
    model = S.build(case.style, case.bug)
    out = plain(case.style, model, tokens())
    assert out.shape == (B, T, VOCAB), case.id
    for expected in case.expects:
        probe = EFFECT[expected]
        assert probe(case.style, S.build(case.style, case.bug)) > TOL, (case.id, expected, probe.__name__)


def test_a_gpt_fast_cache_is_driven_by_setup_caches_and_a_1d_input_pos():
    """issue 44 item 5: gpt-fast's cache (setup_caches(max_batch_size, max_seq_length), a KVCache
    written in place at a 1-D input_pos) is driven bare, from the target string: the healthy model's
    kv_cache passes, a cache mask aligned top-left fails it (it was n/a: no KV cache)."""
    from attention_doctor import examine
    good = examine(resolve("doctor_lab.styles.gpt_fast:healthy"), checks=["eval_dropout", "kv_cache"], strict=True)
    assert good["kv_cache"].outcome == "pass", good["kv_cache"].detail
    assert good.info["conventions"]["cache"] == "setup_caches(max_batch_size, max_seq_length), then a 1-D input_pos"
    bad = examine(resolve("doctor_lab.styles.gpt_fast:cache_top_left"), checks=["eval_dropout", "kv_cache"], strict=True)
    assert bad["kv_cache"].outcome == "fail" and bad["kv_cache"].cause == "new_tokens_differ", bad["kv_cache"].detail
