"""The checks' records, in the order they run (finite_output, the smoke test, first; then
eval_dropout: dropout left on in eval must not read as a leak). A new check: its record here, its function in the module the record names, its
docs (`python -m attention_doctor.docs docs/doctor.md` writes the tables), its test
(tests/test_doctor_registry.py fails while a check module's function has no record). Torch-free."""
from attention_doctor.checks.record import Check, cannot, fails, not_applicable, warns

# shared by batch_independence and padding: a mask shape that holds for one row only
MASK_SHAPE_BATCH_ONLY = warns("it held with a mask encoding found on a batch of two, while an encoding tried "
                              "before it masks one row only (an unexpanded (B, T) mask broadcasting at B = 1): a "
                              "caller passing that shape gets rows mixed or an error")
ONE_ROW_ENCODING = "the mask encoding that masks one row but no batch (a warn names it)"

REGISTRY: tuple[Check, ...] = (
    Check("finite_output", "causality", "finite",
          does="one plain forward on the sample input (the smoke test, before any check)",
          fails_when="any output value is NaN or infinite",
          tolerance="0 non-finite values: every comparison after it needs a finite reference (NaN is never agreement)",
          applies="every target", thread="pytorch/pytorch #41508",
          causes={"nonfinite_output": fails("the plain forward returns NaN or infinite values")},
          measures={"nonfinite": "how many output values are NaN or infinite",
                    "values": "how many output values the plain forward returns"}),
    Check("eval_dropout", "causality", "dropout",
          does="two eval calls on the same input (the target's description, decided before the checks run)",
          fails_when="they differ by more than floating-point reordering explains (a difference across threads "
                     "that one thread removes is reordering: a pass, said, and the checks run on one thread; one "
                     "that stays is measured against the outputs' scale)",
          tolerance="64 ulps of the outputs' dtype relative to the largest |output| (float32: 7.6e-6): reordered "
                    "sums move outputs by a few ulps of their scale (9 measured on hf:gpt2 beside other load), "
                    "dropout moves entries by their own size; a reordering noise kept raises every comparison's "
                    "limit to at least 4x it",
          applies="every target", thread="meta-pytorch/torchtune #1791",
          causes={"sdpa_dropout_p": fails("scaled_dot_product_attention got dropout_p > 0 in eval"),
                  "random_in_eval": fails("something else random ran in eval: the calls differ beyond reordering")},
          measures={"max_diff": "the largest |difference| between the two calls' outputs (inf where they are not "
                                "finite at the same places)",
                    "dropout_p": "the largest dropout_p scaled_dot_product_attention got in eval (0: none seen)",
                    "relative": "calls that differ on the checks' threads: the largest difference over the largest "
                                "|output|",
                    "moved_share": "the share of output entries moved by over 1e-2 of the largest |output| (dropout's "
                                   "signature; reordering moves none)",
                    "zeroed_share": "the share of output entries exactly 0 in one call only (dropout on the outputs "
                                    "themselves)"}),
    Check("future_leak", "causality", "leak",
          does="replaces the tokens from t on (t = 1, T/2, T-1); the gradient of outputs before t w.r.t. inputs from "
               "t on (a backward the target refuses in eval mode leaves that half not run: inconclusive; a forward "
               "under inference mode has no gradient to leak: that half n/a); where the target takes token types "
               "(transformers' token_type_ids), two runs of type 1 and the later one's tokens replaced",
          fails_when="an earlier output moves, or the gradient is not exactly 0",
          tolerance="1e-6: masked keys contribute exp(-huge) = 0 exactly, so a healthy model moves by 0; runs "
                    "after eval_dropout (dropout left on is not a leak)",
          applies="causal targets (LMs; a layer said or found causal)",
          thread="jsbaan/transformer-from-scratch #6", targets=("head_merge_no_transpose",),
          causes={"outputs_move": fails("an earlier output moves when later tokens change"),
                  "later_block_seen": fails("with token types given, an output moves when a later run of type-1 "
                                            "tokens changes (a block that sees the next one)"),
                  "no_token_types": not_applicable("the token-types half: the forward takes no token_type_ids, or its "
                                                   "config declares no image token (what a type means is unknown)"),
                  "gradient_nonzero": fails("outputs do not move measurably, but an earlier output's gradient reaches "
                                            "a later input")},
          measures={"outputs": "per t: {t, change}: the outputs before t, relative change with the tokens from t on "
                               "replaced",
                    "gradient_max": "the largest finite |d earlier outputs / d later inputs| over the t's (None: not "
                                    "measured)",
                    "gradient_nonfinite": "how many of those gradients are not finite (None: not measured)",
                    "later_block": "with token types: the outputs before the later run of type 1, relative change with "
                                   "its tokens replaced (None: the target takes no token types)"}),
    Check("self_visibility", "causality", "self",
          does="whether each query's own key is masked (the call's mask, or a fill in the scores its softmax got; the "
               "weights where no mask is known); where keys are added to the tokens' own (memory keys, attention "
               "sinks, a second stream), a query's own keys are those that move with the tokens",
          fails_when="a query that sees some key has its own key masked",
          tolerance="0 such queries: a causal mask keeps the diagonal (a weight that underflows to 0 beside much "
                    "larger scores is not a mask)",
          applies="targets whose attention calls the doctor sees (cross-attention has no own key: n/a)",
          thread="RVC-Boss/GPT-SoVITS #965",
          targets=("causal_off_by_one",),
          causes={"own_key_masked": fails("a query's own key is masked"),
                  "cross_attention": not_applicable("cross-attention (an Adapter's cross = True): the keys are another "
                                                    "sequence's, no query has a key of its own")},
          measures={"own_key_masked": "queries that see some key and have their own key masked",
                    "queries": "queries that see some key", "calls": "attention calls read",
                    "smallest_own_weight": "the smallest weight on an own key that is visible (None: none)"}),
    Check("kv_cache", "causality", "cache",
          does="prefill T-1 (T-3) tokens, then 1 (3) new ones (T_q != T_k), against the full forward; where the "
               "target decodes through a preallocated cache (transformers' StaticCache under generate()), 3 tokens "
               "decoded through it against the same decoding through the cache grown token by token; where the "
               "target's cache is of its own kind (Mamba's cache_params, RWKV's state), 3 tokens decoded by its "
               "generate() with the cache against without it",
          fails_when="logits differ",
          tolerance="1e-5: the same sums in another order",
          applies="LMs with a KV cache (transformers' past_key_values, this project's KVCache, an Adapter's "
                  "prefill/step)",
          thread="pytorch/pytorch #108108", targets=("causal_kv_cache",),
          causes={"prefill_differs": fails("the prefill's outputs differ from the full forward's"),
                  "new_tokens_differ": fails("the new tokens' outputs after the cache differ (a causal mask aligned "
                                             "top-left when T_q != T_k)"),
                  "static_cache_differs": fails("tokens decoded through a static cache differ from the same "
                                                "decoding through a grown cache (its empty slots seen: a mask "
                                                "dropped for is_causal)")},
          measures={"trials": "per trial: {prefill_tokens, new_tokens, prefill, new}: the prefill's and the new "
                              "tokens' outputs, relative difference from the full forward",
                    "raised_in": "where the target raised: {prefill_tokens, new_tokens, call: prefill, step, generate (its own cache driven by generate()) or static_generate (generate() through a static cache)}",
                    "static_cache": "the tokens decoded through a static cache, relative difference from the same "
                                    "decoding through a grown cache (None: the target offers none)",
                    "generated": "a cache of the target's own kind: the tokens its generate() decodes with the cache, "
                                 "relative difference from the same decoding without it"}),
    Check("sliding_window", "window", "window",
          does="where the target declares a sliding window (transformers: the config's sliding_window, layer_types, "
               "use_sliding_window and max_window_layers; an Adapter's windows()), T beyond it: declared alike on "
               "every layer, the outputs of the queries beyond every stacked window with the first 4 tokens replaced; "
               "declared per layer, or beside layers of no softmax attention (linear attention, convolutions, "
               "recurrences: they carry a token past any window), each attention call's mask against its layer's "
               "declaration (calls in layer order, or, where a layer runs more than once, to the layer whose module "
               "made them: an Adapter's window_layers(); the tokens' keys only where sinks' logits are concatenated; a "
               "layer of an attention kind of the target's own is matched to its call, not judged); "
               "a window named without the layers that take it (a config's sliding_window alone: "
               "Mistral slides every layer, Gemma2 before layer_types alternates in its code), the outputs beyond "
               "every stacked window, then, where they move, each call's mask",
          fails_when="a sliding layer's query reads a key beyond its window (outputs move, or its call leaves the key "
                     "visible), or a layer declared full (the window switched off) does not; a window named without "
                     "its layers that no layer's call applies",
          tolerance="1e-6: a masked key contributes exactly 0; keys up to w + 1 back count as inside (transformers "
                    "has used both conventions); T at most 512",
          applies="targets that declare a sliding window (n/a elsewhere: the declaration is what is checked)",
          thread="huggingface/transformers #32945",
          causes={"window_ignored": fails("a layer declared sliding reads keys beyond its window (the window dropped "
                                          "from the mask)"),
                  "window_applied": fails("a layer declared full (the window switched off) does not read keys beyond "
                                          "the window (a window applied that the config turns off)"),
                  "no_window": not_applicable("the target declares no sliding window"),
                  "window_too_long": cannot("the window over the stacked layers reaches beyond the longest sequence "
                                            "the check runs (512): a smaller window (the zoo's shrunk configs) enables "
                                            "it")},
          measures={"window": "the window declared (keys)",
                    "sliding_layers": "per attention layer: declared sliding",
                    "T": "the sequence length run",
                    "change": "declared alike: the outputs beyond every stacked window, relative change with the first "
                              "4 tokens replaced",
                    "layers": "declared per layer: per attention call {layer, sliding, far_keys_visible, far_keys}: "
                              "the keys beyond the window its mask leaves visible, of how many"}),
    Check("batch_independence", "batching", "batch",
          does="row 0 alone against row 0 in a batch of B = T = 16 rows, unpadded and with the others padded",
          fails_when="row 0 changes",
          tolerance="1e-5: the same sums; B == T because an unexpanded (B, T) mask broadcasts onto the queries "
                    "exactly then",
          applies="every target (the padded half where it takes a padding mask)",
          thread="hyunwoongko/transformer #40", targets=("mask_broadcast",),
          causes={"rows_mix": fails("row 0 changes with the other rows, unpadded"),
                  "padding_mask_broadcast": fails("row 0 changes only when the others are padded (a (B, T) mask "
                                                  "broadcast onto the queries)"),
                  "mask_shape_batch_only": MASK_SHAPE_BATCH_ONLY},
          measures={"batch": "B (= T)", "plain": "row 0 in the batch against alone, unpadded: relative difference",
                    "padded": "the same with the other rows padded (None: the target takes no padding mask)",
                    "one_row_encoding": ONE_ROW_ENCODING}),
    Check("padding", "batching", "pad",
          does="real tokens right-padded and left-padded against the unpadded row (padded positions hold the model's "
               "pad token where it has one: RoBERTa counts positions by it); left padding again with position ids "
               "from the mask",
          fails_when="right or left padding moves the real tokens' outputs",
          tolerance="1e-5; left padding that passes only with position ids from the mask is a `warn` (positions count "
                    "from the padding unless the caller gives them)",
          applies="targets that take a padding mask", thread="huggingface/transformers #21080",
          targets=("left_padding_positions", "mask_broadcast_shape_error"),
          causes={"mask_ignored": fails("its forward takes a padding mask and ignores it: no encoding changes any output, "
                                        "and padding moves the real tokens' outputs"),
                  "nonfinite_outputs": fails("padding makes a real token's output NaN or inf (a -inf fill's NaN row "
                                             "reaching it: pytorch/pytorch #41508)"),
                  "right_padding": fails("right padding moves the real tokens' outputs"),
                  "left_padding": fails("left padding moves them, with position ids from the mask too"),
                  "positions_from_padding": warns("left padding moves them unless the caller passes position ids "
                                                  "from the mask"),
                  "mask_shape_batch_only": MASK_SHAPE_BATCH_ONLY},
          measures={"one_row_encoding": ONE_ROW_ENCODING,
                    "right": "the real tokens' outputs right-padded against unpadded: relative difference",
                    "left": "the same, left-padded",
                    "left_with_positions": "the same, left-padded with position ids from the mask (None: the target "
                                           "takes no position ids)"}),
    Check("fully_masked_rows", "batching", "masked rows",
          does="left padding under a causal mask (rows with no visible key; in a bidirectional target a row that is "
               "padding only), backward from the real positions",
          fails_when="a real output or any parameter gradient is not finite",
          tolerance="0 non-finite; what the padded rows return is reported, with autograd and under no_grad",
          applies="targets that take a padding mask", thread="pytorch/pytorch #41508",
          targets=("fully_masked_rows",),
          causes={"nonfinite_outputs": fails("a real token's output is NaN or inf (a -inf fill's NaN row reaching it)"),
                  "nonfinite_gradients": fails("outputs finite, parameter gradients not (0 * NaN in the backward)"),
                  "mask_ignored": cannot("the target ignores its padding mask (padding fails): no row is ever fully "
                                         "masked")},
          measures={"layout": "the rows with no visible key: left_padding (a causal target) or padding_only_row (a "
                              "bidirectional one)",
                    "nonfinite_outputs": "real tokens' outputs that are not finite",
                    "nonfinite_gradients": "parameter gradients that are not finite (None: not measured)",
                    "padded_rows": "what rows with no visible key return: none, NaN, infinite, zeros or finite values",
                    "padded_rows_no_grad": "the same under no_grad (inference may take another path)"}),
    Check("amplified_logits", "amplified", "amplified",
          does="q and k scaled until the largest score reaches 1e4..1e5 (3e4 aimed for, the factor verified; after "
               "what normalises q and k at their sites where scaling there leaves the scores as they were; scores "
               "the target caps below 1e4, a tanh soft-cap, as far as its cap)",
          fails_when="outputs not finite; a masked key gets weight in a row that sees some key (a row that sees "
                     "none is fully_masked_rows'); earlier outputs move when later tokens change; rows do not sum "
                     "to 1; an output leaves its values' range (also at init)",
          tolerance="1e-6 (weights, leak), 1e-5 of the values' range (hull), 1e-3 (row sums)",
          applies="targets whose scores the doctor sees and can amplify", thread="karpathy/minGPT #75",
          targets=("finite_mask_leak", "naive_softmax", "sum_normalize"),
          causes={"nonfinite": fails("outputs not finite at large scores (a softmax without the max subtracted)"),
                  "masked_key_weight": fails("a masked key gets weight: a finite fill (-1e4) the scores passed"),
                  "future_leak": fails("earlier outputs move with later tokens at large scores"),
                  "row_sum": fails("a row's weights do not sum to 1 (a softmax over the wrong dim)"),
                  "outside_hull": fails("an output leaves the range of the values it mixes: weights that are not "
                                        "convex (s / sum(s) sums to 1 with negative weights)")},
          measures={"largest_score": "the largest |score| reached", "factor": "what q and k were multiplied by",
                    "capped": "the scores stopped growing with q and k below 1e4: stressed as far as the target's cap",
                    "finite": "the amplified outputs are finite",
                    "masked_key_weight": "the largest weight on a masked key (in rows that see some key)",
                    "leak": "earlier outputs' relative change with later tokens replaced, amplified (None: not causal, "
                            "or outputs not finite)",
                    "row_sum_error": "the worst |sum of a row's weights - 1| (None: sigmoid weights only, each key's "
                                     "on its own)",
                    "outside_hull": "the largest excursion of an output outside its values' range, relative to it "
                                    "(at init or amplified; None: sigmoid weights only)",
                    "softmax_dims": "the dims a softmax was taken over other than the keys' (-1)",
                    "unwitnessed": "the parts read inside the forward that fail there while the outputs contradict "
                                   "them (readings_disagree: not judged)"}),
    Check("low_precision", "precision", "low prec.",
          does="float16 and bfloat16, weights cast and under autocast, at init and with scores ~1e3 and ~3e4, plain "
               "and left-padded; each call's error against float64 on its own q, k, v; on a fail, the first failing "
               "run's attention calls name the pattern, and bisection measures the largest score at which the "
               "target stays finite beside the textbook reference's on the same q, k, v; where the outputs stay "
               "finite, each amplified call whose scores overflowed is recomputed with q k^T in float64",
          fails_when="a real output is not finite, or a call's error exceeds twice that of the textbook attention in "
                     "the same dtype (at init; at amplified scores, a call whose scores hold inf or NaN its own "
                     "precision has in range: a sigmoid's weight 1, a masked key at +inf past a finfo.min fill), or "
                     "a batch it runs in its own precision raises; under autocast, a raise on "
                     "writing into the target's own state (a cache buffer set up in the weights' dtype, as gpt-fast's) "
                     "leaves that mode not run (the weights run covers it), while one into a tensor the forward "
                     "made (DBRX's experts) fails",
          tolerance="FlashAttention's rule (2x the reference's error); ~1e3 makes `finfo.min + score` overflow in "
                    "float16, ~3e4 makes an unscaled `q k^T` pass 65504",
          applies="targets whose scores the doctor sees and can amplify (at init: every target)",
          thread="pytorch/pytorch #60939", targets=("qk_fp16_overflow", "mask_min_overflow"),
          causes={
              "qk_before_scale": fails("q k^T formed in low precision before the scale: |q.k| passes the dtype's "
                                       "largest value (65504 in float16) while the scaled score would not; scale q "
                                       "first, or compute the scores in float32"),
              "mask_fill_overflow": fails("a finite mask fill (finfo.min) plus a negative score rounds to -inf in low "
                                          "precision: a row with no visible key turns all -inf, its softmax NaN, and "
                                          "the NaN reaches real tokens (0 * NaN); fill once, or combine boolean masks "
                                          "before filling"),
              "softmax_low_precision": fails("the softmax overflowed in low precision: finite scores, non-finite "
                                             "weights (exp without the row maximum subtracted, or in float16); "
                                             "compute it in float32"),
              "fully_masked_row": fails("a row with no visible key is all -inf and its softmax NaN "
                                        "(fully_masked_rows' failure)"),
              "scores_overflow": fails("the scaled scores themselves pass the dtype's range (the reference overflows "
                                       "as well)"),
              "output_overflow": fails("finite weights, non-finite weights @ v"),
              "outside_attention": fails("the overflow is outside attention's scores (q, k, v arrive non-finite, or "
                                         "every attention call is finite)"),
              "raised_in_low_precision": fails("the target raises in this precision on a batch it runs in its own "
                                               "precision (plain, or left-padded)"),
              "error_ratio": fails("finite, but an attention call's error against float64 exceeds twice the "
                                   "textbook's in the same dtype"),
              "unattributed": fails("non-finite, the calls could not be read to say why")},
          measures={"nonfinite_runs": "per run not finite or that raised: {dtype, mode (weights or autocast), batch "
                                      "(plain or left_padded), scores (None: at init, or the score aimed at), "
                                      "nonfinite (a count) or raised (its error)}",
                    "error_ratio": "per dtype: the worst attention call's error against float64 over the textbook "
                                   "attention's in that dtype (None: q, k, v of the calls not seen)",
                    "hidden_overflow": "per run whose outputs stayed finite though an attention call's scores "
                                       "overflowed (inf or NaN that the target's own precision has in range) and its "
                                       "output is off float64 by more than twice the textbook's error: {dtype, mode, "
                                       "scores (the score aimed at), call, error, textbook_error}",
                    "finite_up_to": "the largest score at which the first failing run stays finite (a fail; None: "
                                    "not measured)",
                    "reference_finite_up_to": "the same for the textbook reference on the same q, k, v (None: not "
                                              "measured; inf: beyond 1e9)"}),
    Check("long_positions", "precision", "long pos.",
          does="outputs at positions +4096 against +0 (q, k made unit-variance so positions matter); bfloat16 "
               "(weights and autocast) error against float64 (float32 where the target does not run in float64: a kernel "
               "without it) at +0 and +4096; where positions are a KV cache's write "
               "offset (start_pos, LitGPT's input_pos), the first attention call's scores among the new tokens "
               "instead of the outputs (they also read the cache's empty slots)",
          fails_when="the shift moves the outputs (targets whose outputs do not move at +16), more than 2x + 1e-3 "
                     "what +16 moves them (a change that does not grow with the distance is a start-of-sequence "
                     "dependence by design: RecurrentGemma resets at position 0), and the scores at +4096 are not "
                     "those at +0 times one factor per query (a temperature by position, Llama 4's or Beam's, is by "
                     "design); or the bfloat16 error near +4096 (its smallest over starts +3904..+4096) exceeds 2x its noise "
                     "(its largest over starts +0..+192, positions bfloat16 holds exactly) + 0.005: a router's "
                     "top-1 flip moves the error at some starts of either side, a phase error at every long one",
          tolerance="1e-3 (also for the per-query fit's residual: float32 phases at 4096 are good to ~2.5e-4 rad; "
                    "bfloat16 phases leave 0.8); measured on 27 healthy runs: shift 1.4e-7..7.1e-6, bf16 error ratio "
                    "0.69..1.66",
          applies="LMs that take position ids up to 4112 (a layer takes none)",
          thread="huggingface/transformers #29496", targets=("rope_low_precision",),
          causes={"shift_moves_outputs": fails("outputs move with a shift of every position (rotary phases that lose "
                                               "precision as positions grow)"),
                  "bfloat16_error_grows": fails("the bfloat16 error near +4096 grows past 2x its noise near +0 (phases "
                                                "computed in bfloat16, e.g. under autocast)"),
                  "bfloat16_nonfinite": fails("in bfloat16 the outputs (scores) are not finite at +0 or +4096 where "
                                              "float64's are"),
                  "raised_in_low_precision": fails("the target raises in bfloat16 (weights or autocast) on the "
                                                   "positions its float64 (float32) reference ran (low_precision's "
                                                   "failure, seen at long positions)"),
                  "shift_moves_mask": fails("positions through a KV cache: at +4096 the new tokens' mask among "
                                            "themselves differs from +0's (a causal mask aligned to the cache's "
                                            "start: kv_cache's failure, seen at long positions)")},
          measures={"through_cache": "positions are a KV cache's write offset: scores among the new tokens compared",
                    "absolute_positions": "the outputs move at +16 already (absolute positions): no shift invariance "
                                          "to test, the bfloat16 half alone",
                    "shift_16": "outputs at +16 against +0: relative change (None: through the cache)",
                    "shift": "outputs (scores) at +4096 against +0: relative change (None: absolute positions)",
                    "per_query_residual": "the scores at +4096 fitted as those at +0 times one factor per query: the "
                                          "largest residual (None: not needed or not seen)",
                    "bfloat16": "per mode (weights, autocast): {mode, reference, error_0, error_4096, noise, long, "
                                "limit, raised}: the error against the reference (float64; float32 where the target "
                                "does not run in float64, or is not finite in it) at +0, at +4096, its largest over "
                                "the starts +0..+192 (noise), its smallest over +3904..+4096 (long); limit: 2x noise + "
                                "0.005; raised: the target's error where that mode raised (the errors None)"}),
    Check("score_scale", "scale", "scale",
          does="q and k made unit-variance at their projections; the std of the dot-product scores reaching the "
               "softmax (where something is added to q . k x scale, a relative bias or ALiBi: the part of the scores "
               "linear in q, measured with q doubled and tripled); where q and k are normalised after every "
               "candidate site (q doubled there moves q k^T by under 5%, a norm's eps keeping it from exactly 0), "
               "or mapped otherwise into calls whose scores are their own q k^T x scale (polar embeddings' "
               "softplus, an l2 distance's augmented q and k in SDPA), the q and k the attention calls get, scaled "
               "inside the calls (the part of the scores quadratic in them) over their rms",
          fails_when="std outside [0.5, 2]",
          tolerance="a missing 1/sqrt(d_k) gives sqrt(d_k) (detectable for d_k >= 5); cosine scores without a "
                    "temperature give about 1/sqrt(d_k)",
          applies="dot-product attention whose q/k layout the doctor knows (additive or bilinear scores: n/a)",
          thread="mlc-ai/mlc-llm #3426", targets=("no_scaling", "cosine_no_temperature"),
          causes={"too_large": fails("scores too large: a missing 1/sqrt(d_k)"),
                  "too_small": fails("scores that cannot sharpen: cosine scores without a temperature"),
                  "not_dot_product": not_applicable("scores are not a fixed multiple of q . k (additive or bilinear "
                                                    "scores, a learned scale): no 1/sqrt(d_k) to miss")},
          measures={"stds": "per attention call: the score std over rms q x rms k (inf: a visible score not finite)",
                    "band": "[low, high]: where the std must lie"}),
    Check("path_agreement", "paths", "paths",
          does="each path the target switches between (transformers' eager/sdpa, this project's explicit/sdpa, MHA's "
               "need_weights): outputs, plain and padded (real tokens), and each call against the textbook attention "
               "on its q, k, v",
          fails_when="paths differ or a call differs from the textbook",
          tolerance="1e-5", applies="targets with switchable attention paths",
          thread="huggingface/transformers #48769",
          causes={"call_vs_textbook": fails("a path's attention call differs from the textbook attention on its own "
                                            "q, k, v"),
                  "paths_differ": fails("the paths' outputs differ (or the padded batch raises on some paths only)")},
          measures={"paths": "per path: {path, textbook}: its calls' largest error against the textbook attention on "
                             "their own q, k, v (None: no call seen)",
                    "against_first": "per other path: {path, plain, padded}: its real outputs' relative difference "
                                     "from the first path's (padded None: not compared)"}),
    Check("config_roundtrip", "roundtrip", "reload",
          does="the target saved and loaded back (transformers: save_pretrained, then from_pretrained from the "
               "temporary directory, its implementation and dtype; an Adapter's reloaded()), plain and left-padded",
          fails_when="the reloaded target's outputs differ from the target's before saving",
          tolerance="1e-5: the same weights and the same computation (a configuration lost on the way moves them "
                    "by orders more)",
          applies="targets that save and load themselves (n/a elsewhere)",
          thread="huggingface/transformers #44913",
          causes={"reload_differs": fails("the model loaded back computes other outputs than before saving (a "
                                          "configuration value not written, or overwritten on load)"),
                  "no_save_load": not_applicable("the target has no save and load of its own"),
                  "not_reloaded": cannot("saving or loading raised (the library's code, not the forward): named in "
                                         "the reason and in `error`")},
          measures={"plain": "the plain batch's outputs reloaded against before saving: relative difference",
                    "padded": "the same, left-padded, real tokens (None: no padding mask)"}),
    Check("encoder_decoder", "seq2seq", "enc-dec",
          does="an encoder-decoder's encoder input (6 tokens) alone, right-padded and left-padded by 5 (mask False "
               "on the pads), the pads filled two ways; the decoder's logits on the same decoder ids, and greedy "
               "generate() of 6 tokens with the decoder's cache and without",
          fails_when="what the pads hold moves the decoder's outputs (right or left), or right padding moves them "
                     "from the source alone's (it shifts no source position)",
          tolerance="1e-5: masked source tokens contribute exactly 0 to cross-attention; the same sums in another "
                    "order differ by rounding only",
          applies="encoder-decoders whose encoder reads token ids (a decoder-only target: n/a)",
          thread="huggingface/transformers #36293",
          causes={"pads_seen": fails("the decoder's outputs move with the encoder input's padding: cross-attention "
                                     "(or the encoder) sees masked source tokens"),
                  "no_encoder": not_applicable("no encoder input beside the decoder's ids")},
          measures={"forward": "{right_pads, left_pads, right_vs_alone}: the decoder's logits, relative differences: "
                               "the two pad fillings right and left, right-padded against the source alone",
                    "generate_cached": "the same for generate()'s logits with the decoder's cache (None: not run)",
                    "generate_uncached": "the same without the cache (None: not run)",
                    "cache": "cached against uncached decoding of the source alone (None: not run; not judged: the "
                             "decoder's cache is kv_cache's, and generate()'s uncached path differs from plain "
                             "forwards on some models, FSMT's at 5.23, untriaged)"}),
    Check("bidirectional_prefix", "prefix", "prefix",
          does="a target whose forward reads token types, in training (train mode, labels on the suffix): which "
               "type makes a leading run of 6 seen both ways, measured; then the row left-padded by 4, the pads "
               "filled two ways and of either type, and its last token replaced",
          fails_when="what the pads hold moves the real tokens' outputs (pads unmasked with the prefix), or an "
                     "output moves with the last token (the suffix not causal)",
          tolerance="1e-5 for the pads (rounding), 1e-6 for the suffix (masked keys contribute exactly 0)",
          applies="targets whose token types mark a prefix or an image seen both ways (transformers: token_type_ids "
                  "where the config declares an image token)",
          thread="huggingface/transformers #35855",
          causes={"pads_seen": fails("in training, what the left pads hold moves the real tokens' outputs: the "
                                     "padding mask lost where the prefix is unmasked"),
                  "suffix_not_causal": fails("in training, an output moves with the last token"),
                  "no_token_types": not_applicable("its forward takes no token types, or its config declares no "
                                                   "image token (what a type means is not declared)"),
                  "no_prefix": not_applicable("in training, with token types and no pixels, no leading run of one "
                                              "type is seen both ways: its mask does not read token types alone"),
                  "prefix_ambiguous": cannot("a leading run is seen both ways, but neither type makes it a prefix "
                                             "before a causal rest: no layout to judge the pads by")},
          measures={"prefix_type": "the token type whose leading run is seen both ways",
                    "moved": "per type: the leading run's outputs, relative change with its last token replaced",
                    "pads": "per pad type: the real tokens' outputs, relative change with what the pads hold",
                    "suffix_leak": "the padded row's outputs before its last token, relative change with it replaced"}),
    Check("multimodal_positions", "mrope", "M-RoPE",
          does="a target that reads position ids of 3 rows (text positions given as rows give its own outputs): an "
               "image of 2x2 tokens laid out as M-RoPE lays one (one temporal value, heights and widths), no "
               "pixels; no attention mask against an all-ones mask, with the positions given and with those the "
               "model makes from the image's grid (n/a where its forward takes no grid); a target whose outputs "
               "do not move with the rows after the first reads none",
          fails_when="the outputs with no mask differ from those with an all-ones mask, or the forward raises "
                     "without a mask only",
          tolerance="1e-5: an all-ones mask masks nothing, the same computation",
          applies="targets that take multi-row position ids (M-RoPE); others n/a",
          thread="huggingface/transformers #39194",
          causes={"unmasked_differs": fails("with no mask the outputs differ from an all-ones mask's: the mask "
                                            "builder reads the image's positions (packed sequences, a cut row)"),
                  "no_multirow_positions": not_applicable("position ids of several rows are refused, read as "
                                                          "other than its own positions, or not read at all (the "
                                                          "rows after the first move nothing)")},
          measures={"positions_given": "the image's positions given: no mask against all ones, relative difference",
                    "own_positions": "the model's own positions from the image's grid: the same (None: not run)",
                    "own_matches_given": "its own positions' outputs against those of the layout given (not "
                                         "judged: the layout is the doctor's)"}),
)
ORDER: tuple[str, ...] = tuple(c.name for c in REGISTRY)
BY_NAME: dict[str, Check] = {c.name: c for c in REGISTRY}
