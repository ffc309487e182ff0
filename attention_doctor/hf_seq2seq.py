"""transformers' encoder-decoders (T5, BART, Marian, ...: a forward that takes decoder_input_ids):
driven as the decoder, a causal LM over its own ids that reads one fixed encoder input, so that the
checks of a causal LM examine the decoder; and through what only an encoder-decoder has, an encoder
input with its own mask, for the encoder_decoder check (its forward, and generate())."""
import torch

from attention_doctor.adapters import Unreachable, Unsupported, _params
from attention_doctor.hf import HFCausalLM
from attention_doctor.module_state import restored
from attention_doctor.signals import TargetRaised

SOURCE_T = 8   # the fixed encoder input the decoder reads in the causal-LM checks
SOURCE_SEED = 4321


def is_seq2seq(model) -> bool:
    """A transformers model whose forward takes decoder ids beside an encoder input (the interface)."""
    return "decoder_input_ids" in _params(model.forward) and hasattr(model, "get_encoder")


class HFSeq2SeqLM(HFCausalLM):
    """An encoder-decoder of transformers: forward(x) is the decoder's logits for decoder ids x after a
    fixed encoder input (all of it real); the cache is the decoder's (past_key_values with the same
    encoder input); encoded_forward and encoded_decode take an encoder input and its mask."""

    def __init__(self, model, name=""):
        super().__init__(model, name)
        self.source_name = getattr(model, "main_input_name", "input_ids")
        cfg = model.config
        specials = {getattr(cfg, k, None) for k in ("pad_token_id", "eos_token_id", "bos_token_id",
                                                     "decoder_start_token_id")}
        self._plain = torch.tensor([i for i in range(self.vocab_size) if i not in specials])

    def source_tokens(self, B, T, gen):
        """Encoder ids (B, T) drawn from the vocabulary without its special tokens (an eos inside would
        end a source)."""
        if self.source_name != "input_ids":
            raise Unreachable(f"its encoder takes {self.source_name}, not token ids: the doctor does not make "
                              "such inputs")
        return self._plain[torch.randint(0, len(self._plain), (B, T), generator=gen)].to(self.device)

    def _source(self, B):
        return self.source_tokens(B, SOURCE_T, torch.Generator().manual_seed(SOURCE_SEED))

    def _encoded(self, B) -> dict:
        src = self._source(B)
        return {"input_ids": src, "attention_mask": torch.ones_like(src)}

    def forward(self, x, mask=None, positions=None):
        if positions is not None:
            raise Unsupported("needs decoder position ids (an encoder-decoder's forward takes none)", "no_positions")
        kw = self._uncached()
        if mask is not None:
            if "decoder_attention_mask" not in _params(self.module.forward):
                raise Unsupported("its forward takes no decoder_attention_mask", "no_padding_mask")
            kw["decoder_attention_mask"] = mask.long()
        return self.module(**self._encoded(x.shape[0]), decoder_input_ids=x, **kw).logits

    def prefill(self, x):
        out = self.module(**self._encoded(x.shape[0]), decoder_input_ids=x, use_cache=True)
        if getattr(out, "past_key_values", None) is None:
            raise Unsupported("no KV cache (use_cache=True returned no past_key_values)", "no_kv_cache")
        return out.past_key_values, out.logits

    def step(self, state, x):
        out = self.module(**self._encoded(x.shape[0]), decoder_input_ids=x, past_key_values=state, use_cache=True)
        return out.past_key_values, out.logits

    def typed_forward(self, x, types, mask=None, labels=None):
        raise Unsupported("an encoder-decoder's decoder takes no token types", "no_token_types")

    def static_decode(self, x, n):
        raise Unreachable("its generate() decodes from an encoder input (encoder_decoder drives it), not after "
                          "decoder ids")

    def generated_decode(self, x, n):
        raise Unreachable("its generate() decodes from an encoder input (encoder_decoder drives it), not after "
                          "decoder ids")

    def embedding(self):
        dec = self.module.get_decoder() if hasattr(self.module, "get_decoder") else None
        emb = dec.get_input_embeddings() if dec is not None and hasattr(dec, "get_input_embeddings") else None
        return emb or super().embedding()

    # -- what only an encoder-decoder has --------------------------------------------------------------
    def encoded_forward(self, src, src_mask, dec):
        """The decoder's logits (B, T_dec, V) for decoder ids dec after the encoder input src (B, S) with
        its mask (B, S) bool, True on real tokens; no cache."""
        return self.module(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=dec,
                           **self._uncached()).logits

    def encoded_decode(self, src, src_mask, n, use_cache=True):
        """The logits (B, n, V) of n tokens greedily decoded by generate() from src with its mask, with
        the decoder's cache or without; the model put back after it."""
        if not hasattr(self.module, "generate"):
            raise Unreachable("no generate() to decode with")
        gen = getattr(self.module, "generation_config", None)
        start = {} if isinstance(getattr(gen, "decoder_start_token_id", None), int) else {
            "decoder_start_token_id": self.pad_id or 0}   # none declared: any fixed token starts the decoder
        try:
            with restored(self.module):
                out = self.module.generate(input_ids=src, attention_mask=src_mask.long(), max_new_tokens=n,
                                           min_new_tokens=n, do_sample=False, num_beams=1, output_logits=True,
                                           return_dict_in_generate=True, pad_token_id=self.pad_id or 0,
                                           eos_token_id=None, use_cache=use_cache, **start)
        except TargetRaised:   # the model's own forward raised: the check's failure
            raise
        except Exception as e:  # noqa: BLE001 -- generate()'s own code refused (not the model's forward): Unreachable, that part of encoder_decoder not run (inconclusive), never a pass
            raise Unreachable(f"generate() refused: {str(e).splitlines()[0][:160] if str(e) else type(e).__name__}") from None
        return torch.stack(out.logits, 1)
