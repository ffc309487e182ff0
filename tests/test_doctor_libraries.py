"""The doctor's adapters for libraries beyond transformers: x-transformers' TransformerWrapper +
Decoder (mask=, pos= / seq_start_pos=, cache= with return_intermediates=True, the flash / einsum
paths) and diffusers' attention modules with their processors (self and cross, the mask as
diffusers' models pass it). Each part skips, saying why, where its library is not installed
(requirements-validation.txt has both)."""
import subprocess
import sys

import pytest
import torch

from attention_doctor import TargetError, Unsupported, adapt, examine
from attention_doctor.targets import resolve
from attention_doctor.xtransformers import parse


def test_options_parse_as_literals():
    assert parse("rotary_pos_emb=True,attn_kv_heads=2,attn_qk_norm_scale=0.5") == {
        "rotary_pos_emb": True, "attn_kv_heads": 2, "attn_qk_norm_scale": 0.5}
    assert parse("custom_layers=('a', 'f'),ff_glu=True,name=x") == {
        "custom_layers": ("a", "f"), "ff_glu": True, "name": "x"}
    with pytest.raises(TargetError, match="not OPTION=VALUE"):
        parse("rotary_pos_emb")


@pytest.mark.parametrize("target,package", [("xt:rotary_pos_emb=True", "x-transformers"),
                                            ("diffusers:AttnProcessor2_0", "diffusers")])
def test_a_missing_library_is_one_line_naming_the_package(target, package):
    blocked = package.replace("-", "_")
    code = (f"import sys; sys.modules[{blocked!r}] = None\n"
            "from attention_doctor.cli import main\n"
            f"sys.exit(main([{target!r}]))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == f"attention-doctor: {target.split(':')[0]}: needs {package} (pip install {package})"


# -- x-transformers ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def xt():
    pytest.importorskip("x_transformers", reason="x-transformers is not installed (requirements-validation.txt)")
    from attention_doctor import xtransformers
    return xtransformers


def test_xt_cache_steps_agree_with_the_full_forward(xt):
    a = xt.target("rotary_pos_emb=True,attn_kv_heads=2")
    x = torch.randint(0, a.vocab_size, (2, 16))
    with torch.no_grad():
        full = a.forward(x)
        state, first = a.prefill(x[:, :13])
        state, three = a.step(state, x[:, 13:])   # T_q = 3 after T_k = 13: cache_age=3
        state, one = a.step(state, torch.randint(0, a.vocab_size, (2, 1)))
    assert three.shape == (2, 3, a.vocab_size) and one.shape == (2, 1, a.vocab_size)
    assert torch.allclose(first, full[:, :13], atol=1e-5) and torch.allclose(three, full[:, 13:], atol=1e-5)


def test_xt_paths_where_flash_is_allowed(xt):
    a = xt.target("rotary_pos_emb=True")     # einsum by default, built flash-capable
    assert a.paths() == ["flash=True", "flash=False"]
    assert not any(m.flash for m in xt._attends(a.module))
    x = torch.randint(0, a.vocab_size, (2, 16))
    with torch.no_grad(), a.use_path("flash=True"):
        assert all(m.flash for m in xt._attends(a.module))
        flash = a.forward(x)
    assert not any(m.flash for m in xt._attends(a.module))
    assert torch.allclose(flash, a.forward(x), atol=1e-5)
    talking = xt.target("attn_pre_talking_heads=True")   # x-transformers refuses talking heads with flash
    assert talking.paths() == []
    with pytest.raises(Unsupported, match="built with flash=False"):
        with talking.use_path("flash=True"):
            pass
    with pytest.raises(TargetError, match="refuses these options"):
        xt.target("attn_pre_talking_heads=True,attn_flash=True")


def test_xt_positions_and_masks_in_the_library_conventions(xt):
    a = xt.target("")                          # absolute positions
    assert a.max_len == xt.SMALL["max_seq_len"]
    x = torch.randint(0, a.vocab_size, (2, 16))
    with torch.no_grad():
        plain = a.forward(x)
        assert torch.equal(a.forward(x, positions=torch.arange(16).expand(2, 16)), plain)
        assert not torch.allclose(a.forward(x, positions=torch.arange(16).expand(2, 16) + 5), plain)
        # left padding with positions from the mask: the real tokens match the unpadded row
        padded = torch.stack([torch.cat([torch.zeros(4, dtype=torch.long), x[0, :12]]), x[1]])
        mask = torch.ones(2, 16, dtype=torch.bool)
        mask[0, :4] = False
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
        assert a._positions(pos)["seq_start_pos"].tolist() == [4, 0]   # x-transformers' own left-padding argument
        got = a.forward(padded, mask=mask, positions=pos)[0, 4:]
        assert torch.allclose(got, a.forward(x[:1, :12])[0], atol=1e-5)
    with pytest.raises(Unsupported, match="RelativePositionBias takes no pos="):
        xt.target("rel_pos_bias=True").forward(x, positions=torch.arange(16).expand(2, 16))


def test_xt_through_the_doctor_and_its_dispatch(xt):
    a = xt.target("rotary_pos_emb=True,attn_flash=True")
    assert type(adapt(a.module)).__name__ == "XTransformersLM"
    assert adapt(a.module).paths() == ["flash=True", "flash=False"]   # a user's model built with flash on
    assert adapt(xt.target("rotary_pos_emb=True").module).paths() == []   # flash off now: capability unknown
    r = examine(a, checks=["kv_cache", "padding", "path_agreement"], strict=True)
    assert [c.verdict for c in r.checks] == ["pass", "pass", "pass"], r.table()


# -- diffusers -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def df():
    pytest.importorskip("diffusers", reason="diffusers is not installed (requirements-validation.txt)")
    from attention_doctor import diffusers
    return diffusers


@pytest.mark.parametrize("spec", ["AttnProcessor2_0", "AttnProcessor,cross", "AttnAddedKVProcessor,cross",
                                  "JointAttnProcessor2_0,cross", "PAGIdentitySelfAttnProcessor2_0"])
def test_diffusers_module_is_a_layer_on_the_input(df, spec):
    a = df.target(spec)
    x = torch.randn(2, 16, a.d_model)
    with torch.no_grad():
        y = a.forward(x)
        assert y.shape == (2, 16, a.d_model) and torch.isfinite(y).all()
        assert torch.allclose(a.forward(x[:1]), y[:1], atol=1e-5)   # the batch layout (PAG's copies) undone


@pytest.mark.parametrize("spec", ["AttnProcessor2_0", "AttnProcessor,cross", "FluxAttnProcessor2_0,cross",
                                  "LuminaAttnProcessor2_0,cross"])
def test_diffusers_mask_hides_the_padded_keys(df, spec):
    """The mask as diffusers' models pass it: the real rows of a left-padded input match the input
    without its padding (the cross path's context is the input twice over, or the joint stream)."""
    a = df.target(spec)
    x = torch.randn(1, 12, a.d_model)
    padded = torch.cat([torch.randn(1, 4, a.d_model) * 5, x], 1)
    mask = torch.ones(1, 16, dtype=torch.bool)
    mask[0, :4] = False
    with torch.no_grad():
        assert torch.allclose(a.forward(padded, mask=mask)[:, 4:], a.forward(x), atol=1e-5)
        assert not torch.allclose(a.forward(padded)[:, 4:], a.forward(x), atol=1e-3)


def test_diffusers_paths_are_the_processors_diffusers_swaps(df):
    a = df.target("AttnProcessor2_0,cross")
    assert a.paths()[:2] == ["AttnProcessor2_0", "AttnProcessor"] and "SlicedAttnProcessor" in a.paths()
    x = torch.randn(2, 16, a.d_model)
    with torch.no_grad():
        sdpa = a.forward(x)
        with a.use_path("AttnProcessor"):
            assert type(a.module.processor).__name__ == "AttnProcessor"
            assert torch.allclose(a.forward(x), sdpa, atol=1e-5)
    assert type(a.module.processor).__name__ == "AttnProcessor2_0"
    assert type(adapt(a.module)).__name__ == "DiffusersAttention"
    r = examine(a, checks=["padding", "path_agreement"], strict=True)
    assert [c.verdict for c in r.checks] == ["pass", "pass"], r.table()


@pytest.mark.parametrize("spec,why", [("XFormersAttnProcessor", "needs xformers"), ("LoRAAttnProcessor", "placeholder"),
                                      ("IPAdapterAttnProcessor2_0", "no self-attention"),
                                      ("AttnProcesor2_0", "did you mean")])
def test_diffusers_what_cannot_run_says_why(df, spec, why):
    with pytest.raises(TargetError, match=why):
        resolve(f"diffusers:{spec}")


def test_diffusers_every_processor_has_a_recipe_or_a_reason(df):
    names = df.processor_names()
    assert len(names) >= 50 and "IPAdapterMaskProcessor" not in names
    built = 0
    for n in names:
        for mode in ("self", "cross"):
            try:
                df.build(f"{n},{mode}")
                built += 1
            except TargetError as e:   # never a build error without a reason from the table
                assert "cannot run here: " in str(e) or f"no {mode}-attention: " in str(e), str(e)
    assert built >= 50
