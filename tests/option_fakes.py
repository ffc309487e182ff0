"""A tiny causal LM registered with transformers' Auto classes for the option discovery's tests: one
config field changes its attention code (halve_scores), one changes its MLP only (gelu_mlp), one
changes nothing at all (unused_flag), one adds a bias to the attention that starts at zero (zero_bias:
no output moves, no other line runs); and a composite config whose model is built from its
text_config (the same fields, one level down)."""
import torch
import torch.nn as nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

MODEL_TYPE = "fake_options"
GENERIC = {"num_hidden_layers": 1, "hidden_size": 16, "num_attention_heads": 2, "vocab_size": 32}


class FakeOptionsConfig(PretrainedConfig):
    model_type = MODEL_TYPE

    def __init__(self, vocab_size=32, hidden_size=16, num_attention_heads=2, num_hidden_layers=1,
                 halve_scores=False, gelu_mlp=False, unused_flag=False, zero_bias=False, **kw):
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.num_attention_heads, self.num_hidden_layers = num_attention_heads, num_hidden_layers
        self.halve_scores, self.gelu_mlp, self.unused_flag = halve_scores, gelu_mlp, unused_flag
        self.zero_bias = zero_bias
        super().__init__(**kw)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.h, self.qkv = cfg.num_attention_heads, nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=False)
        # a bias that starts at zero, on the same lines either way, drawing nothing from the generator
        self.qkv.bias = nn.Parameter(torch.zeros(3 * cfg.hidden_size)) if cfg.zero_bias else None
        self.o = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.halve = cfg.halve_scores

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.h, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        if self.halve:
            s = s / 2
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return self.o((s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.fc, self.gelu = nn.Linear(cfg.hidden_size, cfg.hidden_size), cfg.gelu_mlp

    def forward(self, x):
        x = self.fc(x)
        if self.gelu:
            x = torch.nn.functional.gelu(x)
        return x


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn, self.mlp = Attention(cfg), MLP(cfg)   # attention first: an MLP option leaves its weights

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.mlp(x)


class FakeOptionsLM(PreTrainedModel):
    config_class = FakeOptionsConfig

    def __init__(self, cfg):
        super().__init__(cfg)
        self.emb = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_hidden_layers))
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size)

    def _init_weights(self, module):
        pass   # torch's own init, under the caller's seed

    def get_input_embeddings(self):
        return self.emb

    def forward(self, input_ids=None, past_key_values=None, use_cache=None, **kw):
        x = self.emb(input_ids)
        for b in self.blocks:
            x = b(x)
        return CausalLMOutputWithPast(logits=self.head(x))


COMPOSITE = "fake_options_composite"


class FakeCompositeConfig(PretrainedConfig):
    """A composite config (as Gemma3's, Mpt's): the model reads its options from text_config."""
    model_type = COMPOSITE
    sub_configs = {"text_config": FakeOptionsConfig}

    def __init__(self, text_config=None, **kw):
        self.text_config = text_config if isinstance(text_config, FakeOptionsConfig) else \
            FakeOptionsConfig(**(text_config or {}))
        super().__init__(**kw)


class FakeCompositeLM(FakeOptionsLM):
    config_class = FakeCompositeConfig

    def __init__(self, cfg):
        PreTrainedModel.__init__(self, cfg)
        t = cfg.text_config
        self.emb = nn.Embedding(t.vocab_size, t.hidden_size)
        self.blocks = nn.ModuleList(Block(t) for _ in range(t.num_hidden_layers))
        self.head = nn.Linear(t.hidden_size, t.vocab_size)


def register():
    for name, cfg, model in ((MODEL_TYPE, FakeOptionsConfig, FakeOptionsLM), (COMPOSITE, FakeCompositeConfig, FakeCompositeLM)):
        try:
            AutoConfig.register(name, cfg)
            AutoModelForCausalLM.register(cfg, model)
        except ValueError:
            pass   # registered by an earlier test
