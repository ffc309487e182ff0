"""One record per public target of issue 61's table: which codebase and commit, the file its class
lives in, the factory that builds it small (doctor_lab/public/factories/; the modules it stubs are
read from it, its docstring says why each is unused), and the right outcome of each check the table's row names, with why it is right. Order,
counts and the results table are derived from TARGETS; nothing here imports torch."""
import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FACTORIES = "doctor_lab/public/factories"
EXIT = "exit"       # an Expect on the command's exit code (right: the codes, as strings)
CALLER = "caller"   # an Expect on the caller's model after examine() (caller.py; right: "unchanged")


@dataclass(frozen=True)
class Source:
    """A public codebase, pointed at by `--source NAME=PATH` (a clone; never copied here)."""
    name: str
    repo: str       # owner/name on GitHub
    commit: str     # the commit the committed results were measured at
    why_commit: str = "the snapshot's HEAD when measured"

    def clone(self) -> str:
        return f"git clone https://github.com/{self.repo} {self.name} && git -C {self.name} checkout {self.commit[:12]}"


@dataclass(frozen=True)
class Expect:
    """The right outcome of one check (or of EXIT, or of CALLER): any of `right`, with `cause`
    when it names one; `why` says why that is right for this code."""
    check: str
    right: tuple[str, ...]
    why: str
    cause: str = ""


@dataclass(frozen=True)
class Target:
    name: str
    row: str                     # the row of issue 61's table it stands for
    source: str                  # a Source's name, or "" (installed: `needs`)
    file: str                    # the class's file in the source
    factory: str                 # FILE:FN under FACTORIES, or a TARGET string the CLI takes as it is
    expects: tuple[Expect, ...]
    built: str                   # how it is built, and anything set that the user would not
    needs: str = ""              # a module that must import (a target without a source)
    cli_args: tuple[str, ...] = ()
    repeats: int = 1             # runs of the command; every one is judged
    planted: str = ""            # a bug planted by the factory, if any

    def target(self) -> str:
        return f"{FACTORIES}/{self.factory}" if ".py:" in self.factory else self.factory

    def stubs(self) -> tuple[str, ...]:
        """The modules its factory stubs (stub(...) at the factory's top level; its docstring says
        why each is unused), read from the file, never typed twice."""
        if ".py:" not in self.factory:
            return ()
        tree = ast.parse((ROOT / FACTORIES / self.factory.partition(":")[0]).read_text())
        calls = [n.value for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
                 and getattr(n.value.func, "id", "") == "stub"]
        return tuple(a.value for c in calls for a in c.args if isinstance(a, ast.Constant))


SOURCES = (
    Source("torchtitan", "pytorch/torchtitan", "e38d7abe0fa09c2ec7ccac1729f77cf72faddfc5",
           "the last commit with llama3's `Transformer` (the next, 9810191, renamed it Llama3Model in a config "
           "refactor); HEAD b5bcd76 has no such class"),
    Source("OLMo", "allenai/OLMo", "59a53e3f68e546330ca5a99ec626e58f9ab96494"),
    Source("lingua", "facebookresearch/lingua", "437d680e521873bb5971067148a69587790da853"),
    Source("nanochat", "karpathy/nanochat", "92d63d4e8bb4df75c3b71618f31ddde2378b2bcd"),
    Source("gpt-fast", "pytorch-labs/gpt-fast", "32971d3129541c5bfb4f715abc33d1c5f408d204"),
)
SOURCE = {s.name: s for s in SOURCES}

TITAN = "torchtitan's llama3 Transformer (complex64 freqs_cis)"
NANOCHAT = "nanochat's GPT"
TARGETS = (
    Target("torchtitan-llama3", TITAN, "torchtitan", "torchtitan/models/llama3/model/model.py",
           "torchtitan_factory.py:small",
           (Expect(CALLER, ("unchanged",), "examine() works on copies: the caller's float64 model in train mode keeps "
                                           "its mode, dtype and every tensor's bits, freqs_cis complex64"),
            Expect("long_positions", ("pass",), "its phases are float32 angles in a complex64 table and rotate in "
                                                "float32: +4096 gives the outputs of +0 (a real-cast table would scale, "
                                                "not rotate)"),
            Expect(EXIT, ("0",), "healthy code; no hazard of its formula applies (SDPA scales before q k^T)")),
           "dim 32, 2 layers, 4 heads (2 kv), vocab 64, max_seq_len 4224, init_weights under no_grad"),
    Target("torchtitan-llama3-bf16-phases", TITAN, "torchtitan", "torchtitan/models/llama3/model/model.py",
           "torchtitan_factory.py:phases_in_bfloat16",
           (Expect("long_positions", ("fail",), "angles rounded to bfloat16 drift with the position: far out the "
                                                "relative rotation is wrong; seen only while the table stays complex",
                   cause="shift_moves_outputs"),),
           "as torchtitan-llama3",
           planted="freqs_cis rebuilt from position * frequency rounded to bfloat16 (still complex64)"),
    Target("OLMo", "AllenAI OLMo (past_key_values/use_cache -> presents)", "OLMo", "olmo/model.py",
           "olmo_factory.py:small",
           (Expect("kv_cache", ("pass",), "its presents (per-layer k, v) driven bare: a prompt and then new tokens "
                                          "through the cache equal the full forward"),
            Expect(EXIT, ("0",), "healthy code")),
           "d_model 32, 2 layers, 4 heads, vocab 64, RoPE, dropouts 0, max_sequence_length 4224"),
    Target("OLMo-cache-top-left", "AllenAI OLMo (past_key_values/use_cache -> presents)", "OLMo", "olmo/model.py",
           "olmo_factory.py:cache_top_left",
           (Expect("kv_cache", ("fail",), "the new tokens attend as if they were the sequence's first",
                   cause="new_tokens_differ"),),
           "as OLMo",
           planted="OLMoBlock.attention takes the causal bias's top-left rows on a step after the prompt"),
    Target("lingua", "lingua's LMTransformer (mask passed to SDPA as attn_mask)", "lingua",
           "apps/main/transformer.py", "lingua_factory.py:small",
           (Expect("batch_independence", ("pass", "warn"), "healthy: must not fail; a warn names the mask shape the "
                                                           "caller must pass ((B, 1, T, T): a (B, T, T) mask masks one "
                                                           "row only)"),
            Expect("padding", ("pass", "warn"), "healthy: must not fail (RoPE is relative; the caller's mask pads)"),
            Expect("fully_masked_rows", ("pass",), "SDPA with a boolean mask on a row with no visible key: the doctor's "
                                                   "padded rows return finite values on this torch"),
            Expect(EXIT, ("0",), "healthy code")),
           "dim 32, 2 layers, 4 heads (2 kv), vocab 64, max_seqlen 4224, init_weights; attn_impl sdpa (its default)"),
    Target("nanochat", NANOCHAT, "nanochat", "nanochat/gpt.py", "nanochat_factory.py:small",
           (Expect("low_precision", ("inconclusive",), "it asserts its rotary tables are in its compute dtype "
                                                       "(float32 on CPU): .to(float16) is refused by its contract, "
                                                       "not broken; the doctor could not run it so"),
            Expect("kv_cache", ("pass",), "its KVCache (engine.py) driven bare; at init smear_lambda is 0, so "
                                          "#756's smear on a multi-token step has no effect yet"),
            Expect(EXIT, ("3",), "nothing fails; low_precision could not run (its contract)")),
           "sequence_len 64, 2 layers, 4 heads (2 kv), n_embd 32, vocab 64, init_weights; nanochat.engine imported"),
    Target("nanochat-smear-on", NANOCHAT + ": karpathy/nanochat #756", "nanochat", "nanochat/gpt.py",
           "nanochat_factory.py:smear_on",
           (Expect("kv_cache", ("fail",), "#756 (open): a step of several tokens after the prefill smears as a "
                                          "prefill, its first token without the cached predecessor",
                   cause="new_tokens_differ"),
            Expect("low_precision", ("inconclusive",), "as nanochat")),
           "as nanochat, then smear_lambda 0.5 (a trained checkpoint's token shift on; init_weights zeroes it and "
           "#756 shows only where it is non-zero)"),
    Target("nanochat-next-key-visible", NANOCHAT + "'s own init (output projections zero), a mask that shows the next "
           "key", "nanochat", "nanochat/gpt.py", "nanochat_factory.py:next_key_visible",
           (Expect("future_leak", ("fail",), "each query sees the next key: at init the outputs cannot move (c_proj "
                                             "zero), so the doctor must look on a copy with those weights filled"),
            Expect("amplified_logits", ("fail",), "the same visible later key, read in the mask, with non-zero "
                                                  "weight on it")),
           "as nanochat",
           planted="nanochat.flash_attention._sdpa_attention (its CPU path) with key j visible to query i for "
                   "j <= i + 1"),
    Target("gpt-fast", "gpt-fast's model.py (forward needs input_pos, behind setup_caches)", "gpt-fast", "model.py",
           "gpt_fast_factory.py:small",
           (Expect(EXIT, ("0", "1", "3"), "examined, not refused (exit 2): the doctor gives input_pos and sets up "
                                          "its caches"),
            Expect("kv_cache", ("pass",), "its KVCache driven bare through setup_caches and input_pos")),
           "dim 32, 2 layers, 4 heads (2 kv), vocab 64, block_size 4224; setup_caches not called"),
    Target("hf:gpt2-eager", "hf:gpt2, eager, beside other load", "", "transformers/models/gpt2/modeling_gpt2.py",
           "hf:gpt2", (Expect("eval_dropout", ("pass",), "eval mode has no dropout: two eval calls agree up to "
                                                         "floating-point reordering, on a busy machine too"),),
           "the doctor's own small config, random weights", needs="transformers", cli_args=("--attn-impl", "eager"),
           repeats=3),
)
BY_NAME = {t.name: t for t in TARGETS}
