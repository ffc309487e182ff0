"""The checks' fixed facts: the catalogue experiments whose failure value each one targets (the
first is shown: `python run.py +exp=NAME` reproduces it), and the public thread where that
failure was shipped."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    name: str
    targets: tuple[str, ...]   # conf/exp/NAME.yaml whose failure value this check targets
    thread: str                # owner/repo #N
    looks_for: str

    @property
    def experiment(self) -> str:
        return self.targets[0] if self.targets else ""


ENTRIES = [
    Entry("eval_dropout", (), "meta-pytorch/torchtune #1791",
          "attention dropout still on in eval: two eval calls differ"),
    Entry("future_leak", ("head_merge_no_transpose",), "jsbaan/transformer-from-scratch #6",
          "an output before position t changes when tokens at and after t change"),
    Entry("self_visibility", ("causal_off_by_one",), "RVC-Boss/GPT-SoVITS #965",
          "a query that cannot see its own key (causal diagonal off by one)"),
    Entry("kv_cache", ("causal_kv_cache",), "pytorch/pytorch #108108",
          "cached decoding (T_q != T_k) disagrees with the full forward"),
    Entry("batch_independence", ("mask_broadcast",), "hyunwoongko/transformer #40",
          "a row's output depends on the other rows (an unexpanded (B, T) mask, B == T)"),
    Entry("padding", ("left_padding_positions", "mask_broadcast_shape_error"), "huggingface/transformers #21080",
          "right or left padding changes the real tokens' outputs"),
    Entry("fully_masked_rows", ("fully_masked_rows",), "pytorch/pytorch #41508",
          "a row with no visible key turns real outputs or gradients into NaN"),
    Entry("amplified_logits", ("finite_mask_leak", "naive_softmax", "sum_normalize"), "karpathy/minGPT #75",
          "with scores at 1e4..1e5: non-finite outputs, a masked key with weight, outputs outside the values' hull"),
    Entry("low_precision", ("qk_fp16_overflow", "mask_min_overflow"), "pytorch/pytorch #60939",
          "float16/bfloat16 error beyond twice a reference attention's; inf or NaN with large q.k"),
    Entry("long_positions", ("rope_low_precision",), "huggingface/transformers #29496",
          "outputs at positions shifted by 4096 differ (rotary phases in low precision)"),
    Entry("score_scale", ("no_scaling", "cosine_no_temperature"), "mlc-ai/mlc-llm #3426",
          "scores of unit-variance q and k with a standard deviation far from 1 (a missing 1/sqrt(d_k))"),
    Entry("path_agreement", (), "huggingface/transformers #48769",
          "the target's attention paths disagree with each other or with the reference"),
]
CATALOGUE = {e.name: e for e in ENTRIES}
ORDER = [e.name for e in ENTRIES]  # eval_dropout first: dropout left on must not read as a leak
