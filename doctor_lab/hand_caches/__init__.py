"""KV caches as people write them by hand, each a tiny causal LM written here in the manner of a
public project (never its code), healthy and with cache bugs planted, each taken bare from the
command line (`python -m attention_doctor doctor_lab/hand_caches/MODULE.py:healthy` or `...:BUG`):

- own_cache.py: a cache object of the model's own class passed in as `kv_cache=` (nanochat's
  `KVCache`), with a token shift ("smear") that a multi-token step after the prefill must take from
  the cache (karpathy/nanochat#756);
- presents.py: `forward(idx, past_key_values=None, use_cache=False) -> (logits, presents)`, the
  presents per layer (k, v) or a latent and a rope key (DeepSeek-V2-style latent attention), as a
  tuple or as AllenAI OLMo's NamedTuple;
- input_pos.py: a forward that needs its positions (`input_pos`) and a cache set up first
  (`setup_caches(max_batch_size, max_seq_length)`), as gpt-fast's model.py.

Each module says `PLANTED` (bug -> how) and gives `healthy` and one zero-argument factory per bug."""
