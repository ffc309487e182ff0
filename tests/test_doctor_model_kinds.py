"""The checks of the model kinds beyond causal LMs, on tiny transformers models with random weights
(no download), each healthy and with a bug planted in a subclass of the same model:
encoder_decoder on T5 whose forward drops the encoder's mask (cross-attention sees the pads, as T5's
generate() did in 4.49); bidirectional_prefix on PaliGemma whose training forward drops the padding
mask (the pads unmasked with the prefix, as 4.45-4.48 did); multimodal_positions on Qwen2-VL whose
forward without a mask cuts the row where the temporal positions repeat (an image read as packed
sequences, as 4.53.1-4.57.0 did)."""
import pytest
import torch

from attention_doctor import examine
from attention_doctor.result import FAIL, NA, PASS

pytestmark = pytest.mark.validation
tf = pytest.importorskip("transformers")


def _t5(buggy):
    from transformers import T5Config, T5ForConditionalGeneration

    class MaskDropped(T5ForConditionalGeneration):
        def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None, **kwargs):
            return super().forward(input_ids=input_ids, decoder_input_ids=decoder_input_ids, **kwargs)   # mask dropped

    cfg = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                   relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    torch.manual_seed(0)
    return (MaskDropped if buggy else T5ForConditionalGeneration)(cfg).eval()


def _paligemma(buggy):
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

    class PadsUnmaskedInTraining(PaliGemmaForConditionalGeneration):
        def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, **kwargs):
            return super().forward(input_ids=input_ids, attention_mask=None if labels is not None else attention_mask,
                                   token_type_ids=token_type_ids, labels=labels, **kwargs)

    cfg = PaliGemmaConfig(
        vision_config={"model_type": "siglip_vision_model", "hidden_size": 16, "intermediate_size": 32,
                       "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 8, "patch_size": 4},
        text_config={"model_type": "gemma", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                     "pad_token_id": 0},
        image_token_index=63, vocab_size=64, projection_dim=32, hidden_size=32, pad_token_id=0)
    torch.manual_seed(0)
    return (PadsUnmaskedInTraining if buggy else PaliGemmaForConditionalGeneration)(cfg).eval()


def _qwen2_vl(buggy):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    class CutAtImage(Qwen2VLForConditionalGeneration):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, image_grid_thw=None, **kwargs):
            if attention_mask is None and position_ids is not None and position_ids.dim() == 3:
                t = position_ids[0]   # a new "sequence" where the temporal row does not step by 1: keys before it hidden
                starts = torch.cumsum(torch.nn.functional.pad(t[:, 1:] - t[:, :-1] != 1, (1, 0)), 1)
                attention_mask = (starts == starts[:, -1:]).long()
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                   image_grid_thw=image_grid_thw, **kwargs)

    text = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2,
                rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]})
    vision = dict(depth=1, embed_dim=32, hidden_size=32, num_heads=4, mlp_ratio=2, patch_size=2,
                  spatial_merge_size=2, temporal_patch_size=2, in_chans=3)
    cfg = Qwen2VLConfig(text_config=dict(text), vision_config=vision, image_token_id=100, video_token_id=101,
                        vision_start_token_id=102, vision_end_token_id=103, **text)
    torch.manual_seed(0)
    return (CutAtImage if buggy else Qwen2VLForConditionalGeneration)._from_config(cfg, attn_implementation="sdpa").eval()


def row(model, check):
    return examine(model, checks=[check], strict=True)[check]


def test_encoder_decoder_passes_t5_and_fails_where_cross_attention_sees_the_pads():
    ok = row(_t5(False), "encoder_decoder")
    assert ok.outcome is PASS and ok.measurements["generate_cached"]["right_pads"] == 0.0, ok.detail
    bad = row(_t5(True), "encoder_decoder")
    assert bad.outcome is FAIL and bad.cause == "pads_seen", bad.detail
    assert bad.measurements["forward"]["right_pads"] > 1e-3


def test_bidirectional_prefix_passes_paligemma_and_fails_where_training_unmasks_the_pads():
    ok = row(_paligemma(False), "bidirectional_prefix")
    assert ok.outcome is PASS and ok.measurements["prefix_type"] == 0, ok.detail
    bad = row(_paligemma(True), "bidirectional_prefix")
    assert bad.outcome is FAIL and bad.cause == "pads_seen" and bad.measurements["pads"]["pads_type_0"] > 1e-3


def test_multimodal_positions_passes_qwen2_vl_and_fails_where_no_mask_cuts_the_row_at_the_image():
    ok = row(_qwen2_vl(False), "multimodal_positions")
    assert ok.outcome is PASS and ok.measurements["own_positions"] == 0.0, ok.detail
    bad = row(_qwen2_vl(True), "multimodal_positions")
    assert bad.outcome is FAIL and bad.cause == "unmasked_differs" and bad.measurements["positions_given"] > 1e-3


def test_a_causal_lm_has_none_of_these_interfaces():
    from attention_doctor.hf import build
    r = examine(build("llama", "sdpa"), checks=["encoder_decoder", "bidirectional_prefix", "multimodal_positions"])
    assert [c.outcome for c in r.checks] == [NA, NA, NA], [c.reason for c in r.checks]


def test_position_rows_ignored_or_broadcast_as_a_batch_are_no_multirow_positions():
    """The zoo's false alarms of the first version: a model that ignores position_ids when a mask is given
    (and raises on 3 rows without one: Jamba's mask path) and one whose learned positions broadcast 3 rows
    into a batch (BioGPT) take no multi-row positions: n/a, not fail or inconclusive; Qwen2-VL still reads them."""
    from transformers import AutoModelForCausalLM

    from doctor_lab.zoo.shrink import load_table, make_config
    for arch, impl in (("jamba", "eager"), ("biogpt", "sdpa")):
        torch.manual_seed(0)
        m = AutoModelForCausalLM.from_config(make_config(arch, load_table()), attn_implementation=impl).eval()
        r = row(m, "multimodal_positions")
        assert r.outcome is NA and r.cause == "no_multirow_positions", (arch, r.outcome, r.reason)


def test_a_forward_that_raises_only_without_a_mask_is_examined_and_one_that_always_raises_is_not():
    from attention_doctor import TargetError
    from attention_doctor.hf import HFCausalLM
    from tests.test_doctor_hf_cache import GivenCacheLM

    class NeedsMask(GivenCacheLM):
        def __init__(self, always=False):
            super().__init__()
            self.always = always

        def forward(self, input_ids, attention_mask=None, **kwargs):
            if attention_mask is None or self.always:
                raise RuntimeError("no mask")
            return super().forward(input_ids, attention_mask=attention_mask, **kwargs)

    torch.manual_seed(0)
    r = examine(HFCausalLM(NeedsMask().eval()), checks=["finite_output", "padding"])
    assert "no mask" in r.info["unmasked_forward_raised"] and r["finite_output"].outcome is PASS
    with pytest.raises(TargetError, match="its forward raised"):
        examine(HFCausalLM(NeedsMask(always=True).eval()), checks=["finite_output"])
