"""Realistic benchmark models: random weights in the shapes of real 1B-3B checkpoints, as GGUF files.

    python benchmarks/make_models.py [--models llama-3.2-1b,qwen2.5-1.5b,qwen2.5-3b] [--types q4_k_m,q4_0,q8_0]
    python benchmarks/make_models.py --list        # the paths of the files already built

Speed depends on the tensors' shapes and types, not on their values, so a random checkpoint in a real
model's shapes benchmarks like the real model: each is written in Hugging Face's layout (config.json,
safetensors in f16, a byte-level BPE tokenizer.json of the real vocabulary size) and converted with
`llamacy convert` to each --type. Weights are N(0, 0.02) like a trained model's (norm weights near 1, Qwen's
q/k/v biases small), so the quantizers see realistic ranges. The tokenizer is synthetic (the 256 byte
symbols, the two-byte characters, then made-up merges up to the real count) with the real pre-tokenizer; the
text it produces means nothing, which no speed test needs, but is valid UTF-8, which llama-server needs.
Files built before that rule (2026-12-03) make llama-server fail every completion: delete and rebuild them.

Files go to ~/.cache/llamacy/bench-models/<model>-<TYPE>.gguf (outside the repository; $XDG_CACHE_HOME is
honoured); a file already there is kept. The Hugging Face checkpoint is deleted once every requested type of
that model is converted (a 3B f16 checkpoint is ~6 GB).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class Shape:
    """A real model's config.json values (those that set tensor shapes and the forward pass)."""

    arch: str  # llama | qwen2
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int  # config vocab_size: the embedding's rows
    n_text_tokens: int  # regular tokens of the real tokenizer (the rest up to vocab is specials/padding)
    tied: bool
    extra: dict = field(default_factory=dict)


LLAMA3_ROPE = {
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
}
QWEN_ROPE = {"rope_theta": 1000000.0, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6}

MODELS: dict[str, Shape] = {
    # meta-llama/Llama-3.2-1B-Instruct: tied embedding, GQA 32/8, head_dim 64.
    "llama-3.2-1b": Shape("llama", 2048, 8192, 16, 32, 8, 128256, 128000, True, LLAMA3_ROPE),
    # Qwen2.5-1.5B's shapes with an untied output head (as DeepSeek-R1-Distill-Qwen-1.5B has): the case
    # issue #29 measured, where the Q6_K head is 10% of decode.
    "qwen2.5-1.5b": Shape("qwen2", 1536, 8960, 28, 12, 2, 151936, 151643, False, QWEN_ROPE),
    # Qwen/Qwen2.5-3B-Instruct: tied embedding, GQA 16/2.
    "qwen2.5-3b": Shape("qwen2", 2048, 11008, 36, 16, 2, 151936, 151643, True, QWEN_ROPE),
    # meta-llama/Llama-3.2-3B-Instruct.
    "llama-3.2-3b": Shape("llama", 3072, 8192, 28, 24, 8, 128256, 128000, True, LLAMA3_ROPE),
}
# Hybrid models (issue #25), written with the tests' checkpoint writers (tests/hf_qwen3next.py,
# tests/hf_nemotron_h.py) at real sizes, float32, random weights; their tokenizer is the tests' small BPE one,
# padded by the converter to the real vocabulary size (the embedding's and output head's rows).
_QWEN35_08B = dict(
    kind="qwen3_5",
    hidden_size=1024,
    num_hidden_layers=24,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=256,
    intermediate_size=3584,
    full_attention_interval=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=16,
    vocab_size=248320,
    tie_word_embeddings=True,
    max_position_embeddings=32768,
)
_MTP = dict(mtp=True, mtp_num_hidden_layers=1)  # with one multi-token-prediction block (random_weights)
HYBRIDS: dict[str, dict] = {
    # Qwen3.5-0.8B's text model as we read its config: width 1024, 24 layers of which every 4th is gated
    # attention (8 heads, 2 KV, head 256, a quarter rotated), the rest gated delta-nets (16 key and 16
    # value heads of 128, convolution 4); FFN 3584; vocabulary 248320, tied embedding.
    "qwen3.5-0.8b": _QWEN35_08B,
    # The same with its multi-token-prediction block (mtp.*: one gated-attention layer and its FFN, as
    # the released checkpoints carry), for speculate mtp (bench_mtp.py).
    "qwen3.5-0.8b-mtp": {**_QWEN35_08B, **_MTP},
    # Not a released shape: Qwen3.5's layer pattern at width 2048 (2.2B parameters, 16 attention heads of
    # 256 with 2 KV, 16 key / 32 value delta-net heads of 128, FFN 6144), with its MTP block: the cost
    # side of speculate mtp on a model whose head is a smaller share of a step (bench_mtp.py).
    "hybrid-2b-mtp": {
        **_QWEN35_08B,
        **_MTP,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "intermediate_size": 6144,
        "linear_num_value_heads": 32,
    },
    # A Nemotron-H layer mix at 1.3B: Nemotron-H-8B's pattern style (Mamba2 / MLP alternating, an attention
    # layer every ~8) at width 2048: 11 Mamba2 layers (64 heads of 64, d_state 128, 8 groups), 2 attention
    # (16 heads, 4 KV, head 128, no RoPE), 11 ReLU² MLPs of 8192; vocabulary 131072, untied head.
    "nemotron-h-1.3b": dict(
        kind="nemotron_h",
        pattern="M-M-M*-M-M-M-M*-M-M-M-M-",
        n_embd=2048,
        n_head=16,
        n_head_kv=4,
        head_dim=128,
        n_ff=8192,
        mamba_heads=64,
        mamba_head_dim=64,
        d_state=128,
        n_groups=8,
        d_conv=4,
        n_vocab=131072,
    ),
}
# Gemma 4 (issue #26): E2B's text model as its config.json gives it. Width 1536, 35 layers in the pattern
# 4 sliding (window 512, head 256, RoPE base 1e4) + 1 full (head 512, proportional RoPE, a quarter rotated,
# base 1e6); 8 query heads, 1 KV head; the last 20 layers share the K/V of earlier ones and have the
# double-wide FFN (12288 instead of 6144); per-layer inputs of 256 per layer from a second 262144-row table;
# final logit soft-capping 30; tied embedding. Written as f16 shards by write_gemma4 (the tests' tiny writer
# holds every tensor in float32 at once: 18 GB at this size), with the tests' Gemma 4 tokenizer.json (a few
# hundred real tokens), padded by the converter to the real vocabulary size.
GEMMA4: dict[str, dict] = {
    "gemma4-e2b": dict(
        hidden_size=1536,
        intermediate_size=6144,
        num_hidden_layers=35,
        num_attention_heads=8,
        num_key_value_heads=1,
        num_global_key_value_heads=1,
        head_dim=256,
        global_head_dim=512,
        attention_k_eq_v=False,
        sliding_window=512,
        layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 7,
        num_kv_shared_layers=20,
        use_double_wide_mlp=True,
        hidden_size_per_layer_input=256,
        vocab_size=262144,
        vocab_size_per_layer_input=262144,
        max_position_embeddings=131072,
        final_logit_softcapping=30.0,
    ),
}
DEFAULT_MODELS = "llama-3.2-1b,qwen2.5-1.5b,qwen2.5-3b"
DEFAULT_TYPES = "q4_k_m,q4_0,q8_0"


def out_dir() -> Path:
    from llamacy.catalog import cache_dir

    return cache_dir() / "bench-models"


def gguf_path(model: str, qtype: str) -> Path:
    return out_dir() / f"{model}-{qtype.upper()}.gguf"


def built_models() -> list[tuple[str, Path]]:
    """(label, path) of every benchmark model already built, in MODELS order then type order."""
    found = []
    for model in [*MODELS, *HYBRIDS, *GEMMA4]:
        for qtype in ("q4_k_m", "q4_0", "q8_0", *DEFAULT_TYPES.split(",")):
            p = gguf_path(model, qtype)
            if p.is_file() and (f"{model} {qtype.upper()}", p) not in found:
                found.append((f"{model} {qtype.upper()}", p))
    return found


def byte_symbols() -> list[tuple[int, str]]:
    """GPT-2's byte-to-unicode map, in its order: (byte, symbol) for token ids 0..255 of a byte-level BPE
    vocabulary."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [(b, chr(c)) for b, c in zip(bs, cs, strict=True)]


def lone_byte_ids() -> list[int]:
    """The ids of the 128 byte tokens 0x80-0xFF: none is text on its own (a UTF-8 lead or continuation byte)."""
    return [i for i, (b, _) in enumerate(byte_symbols()) if b >= 0x80]


def write_tokenizer(directory: Path, shape: Shape) -> None:
    """A byte-level BPE tokenizer.json with shape.n_text_tokens regular tokens, three special tokens after
    them, the model's real split regex, and a ChatML tokenizer_config.json.

    The regular tokens: the 256 byte symbols; the 1,920 two-byte characters U+0080-U+07FF (lead byte and
    continuation merged); then made-up merges, every token of the last layer followed by every character,
    in order. Every token but the 128 lone high bytes is therefore valid UTF-8 on its own, and so is any
    sequence of them: llama-server rejects a completion that is not (HTTP 500, "does not match the expected
    Content-only format"), and write_checkpoint keeps the model from ever choosing a lone byte."""
    symbols = byte_symbols()
    sym = {b: c for b, c in symbols}
    vocab: dict[str, int] = {c: i for i, (_, c) in enumerate(symbols)}
    merges: list[str] = []
    chars = [sym[b] for b in range(0x80)]  # ASCII: a character in one byte
    for lead in range(0xC2, 0xE0):
        for cont in range(0x80, 0xC0):
            vocab[sym[lead] + sym[cont]] = len(vocab)
            merges.append(f"{sym[lead]} {sym[cont]}")
            chars.append(sym[lead] + sym[cont])
    need = shape.n_text_tokens
    layer = chars
    while len(vocab) < need:
        nxt = []
        for a in layer:
            for b in chars:
                if len(vocab) >= need:
                    break
                if a + b not in vocab:
                    vocab[a + b] = len(vocab)
                    merges.append(f"{a} {b}")
                    nxt.append(a + b)
            if len(vocab) >= need:
                break
        layer = nxt
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    added = []
    for s in specials:
        vocab[s] = len(vocab)
        added.append({"id": vocab[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True})  # fmt: skip
    regex = QWEN2_REGEX if shape.arch == "qwen2" else LLAMA3_REGEX
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": shape.arch == "llama", "vocab": vocab, "merges": merges,
        },
    }  # fmt: skip
    (directory / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    chatml = (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
        "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    config = {
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>",
        "pad_token": "<|im_end|>", "add_bos_token": False, "chat_template": chatml,
    }  # fmt: skip
    (directory / "tokenizer_config.json").write_text(json.dumps(config))


class Shards:
    """Random f16 weights saved as safetensors shards, and the index that names them: what the checkpoint
    writers below share. normal() fills big tensors 64M values at a time (the same numbers as in one draw),
    so that a 262144-row table never exists in float32."""

    def __init__(self, directory: Path, seed: int) -> None:
        self.directory = directory
        self.rng = np.random.default_rng(seed)
        self.weight_map: dict[str, str] = {}

    def normal(self, *dims: int, std: float = 0.02) -> np.ndarray:
        out = np.empty(dims, dtype=np.float16)
        step = max(1, (1 << 26) // max(1, int(np.prod(dims[1:]))))
        for r in range(0, dims[0], step):
            n = min(step, dims[0] - r)
            out[r : r + n] = self.rng.standard_normal((n, *dims[1:]), dtype=np.float32) * std
        return out

    def norm(self, n: int) -> np.ndarray:  # norm weights near 1
        return (1.0 + 0.1 * self.rng.standard_normal(n, dtype=np.float32)).astype(np.float16)

    def save(self, tensors: dict[str, np.ndarray], fname: str) -> None:
        from safetensors.numpy import save_file

        save_file(tensors, str(self.directory / fname))
        self.weight_map.update(dict.fromkeys(tensors, fname))

    def write_index(self) -> None:
        index = {"metadata": {"total_size": 0}, "weight_map": self.weight_map}
        (self.directory / "model.safetensors.index.json").write_text(json.dumps(index))


def write_checkpoint(directory: Path, name: str, shape: Shape, seed: int = 0) -> None:
    """config.json, tokenizer and f16 safetensors (one shard per layer, plus embeddings), random weights."""
    directory.mkdir(parents=True, exist_ok=True)
    write_tokenizer(directory, shape)
    head_dim = shape.hidden // shape.heads
    cls = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[shape.arch]
    cfg = {
        "architectures": [cls], "model_type": shape.arch, "hidden_size": shape.hidden,
        "intermediate_size": shape.ffn, "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads, "vocab_size": shape.vocab, "hidden_act": "silu",
        "tie_word_embeddings": shape.tied, "torch_dtype": "bfloat16", "bos_token_id": shape.n_text_tokens,
        "eos_token_id": shape.n_text_tokens + 2, "_name": f"random-weight {name} (benchmarks/make_models.py)",
        **shape.extra,
    }  # fmt: skip
    (directory / "config.json").write_text(json.dumps(cfg, indent=1))
    sh = Shards(directory, seed)
    normal, norm = sh.normal, sh.norm
    q_dim, kv_dim = shape.heads * head_dim, shape.kv_heads * head_dim
    # Zero rows for the lone high bytes: their logit is then 0 for every state, never among the top of 150k
    # random logits, so neither greedy nor top-k sampling writes one (see write_tokenizer). The bytes read per
    # token and the work are the same as for random rows.
    emb = {
        "model.embed_tokens.weight": normal(shape.vocab, shape.hidden),
        "model.norm.weight": norm(shape.hidden),
    }
    lone = lone_byte_ids()
    emb["model.embed_tokens.weight"][lone] = 0
    if not shape.tied:
        emb["lm_head.weight"] = normal(shape.vocab, shape.hidden)
        emb["lm_head.weight"][lone] = 0
    sh.save(emb, "model-embed.safetensors")
    del emb
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        w = {
            p + "input_layernorm.weight": norm(shape.hidden),
            p + "post_attention_layernorm.weight": norm(shape.hidden),
            p + "self_attn.q_proj.weight": normal(q_dim, shape.hidden),
            p + "self_attn.k_proj.weight": normal(kv_dim, shape.hidden),
            p + "self_attn.v_proj.weight": normal(kv_dim, shape.hidden),
            p + "self_attn.o_proj.weight": normal(shape.hidden, q_dim),
            p + "mlp.gate_proj.weight": normal(shape.ffn, shape.hidden),
            p + "mlp.up_proj.weight": normal(shape.ffn, shape.hidden),
            p + "mlp.down_proj.weight": normal(shape.hidden, shape.ffn),
        }
        if shape.arch == "qwen2":
            for proj, n in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
                w[p + f"self_attn.{proj}_proj.bias"] = normal(n, std=0.1)
        sh.save(w, f"model-layer{i:03d}.safetensors")
    sh.write_index()


def write_gemma4(directory: Path, name: str, seed: int = 0) -> None:
    """A Gemma4ForConditionalGeneration checkpoint of GEMMA4[name]'s shape (text weights only; the converter
    needs no vision tower), f16, one shard per layer; tensor names and per-layer shapes are the tests' own
    (tests/hf_gemma4.py: layer_shape), so this is the layout the converter is tested against."""
    from tests.hf_gemma4 import TEXT, gemma4_text_config, layer_shape
    from tests.test_gemma4_tokenizer import write_hf_gemma4_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    write_hf_gemma4_tokenizer(directory)
    spec = dict(GEMMA4[name])
    c = gemma4_text_config(spec.pop("vocab_size"), **spec)
    top = {
        "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": c,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "_name": f"random-weight {name} (benchmarks/make_models.py)",
    }  # fmt: skip
    (directory / "config.json").write_text(json.dumps(top, indent=1))
    sh = Shards(directory, seed)
    normal, norm, save = sh.normal, sh.norm, sh.save
    E, NH, P, L, V = (
        c["hidden_size"],
        c["num_attention_heads"],
        c["hidden_size_per_layer_input"],
        c["num_hidden_layers"],
        c["vocab_size"],
    )

    save(
        {TEXT + "embed_tokens.weight": normal(V, E), TEXT + "norm.weight": norm(E)}, "model-embed.safetensors"
    )
    save(
        {
            TEXT + "embed_tokens_per_layer.weight": normal(V, L * P),
            TEXT + "per_layer_model_projection.weight": normal(L * P, E),
            TEXT + "per_layer_projection_norm.weight": norm(P),
        },
        "model-per-layer.safetensors",
    )
    for il in range(L):
        s, p = layer_shape(c, il), f"{TEXT}layers.{il}."
        HD, KV = s["head_dim"], s["n_kv"] * s["head_dim"]
        w = {
            p + "input_layernorm.weight": norm(E),
            p + "self_attn.q_proj.weight": normal(NH * HD, E),
            p + "self_attn.q_norm.weight": norm(HD),
            p + "self_attn.o_proj.weight": normal(E, NH * HD),
            p + "post_attention_layernorm.weight": norm(E),
            p + "pre_feedforward_layernorm.weight": norm(E),
            p + "mlp.gate_proj.weight": normal(s["n_ff"], E),
            p + "mlp.up_proj.weight": normal(s["n_ff"], E),
            p + "mlp.down_proj.weight": normal(E, s["n_ff"]),
            p + "post_feedforward_layernorm.weight": norm(E),
            p + "layer_scalar": norm(1),
            p + "per_layer_input_gate.weight": normal(P, E),
            p + "per_layer_projection.weight": normal(E, P),
            p + "post_per_layer_input_norm.weight": norm(E),
        }
        if not s["shared"]:  # shared-KV layers have no K/V projections
            w[p + "self_attn.k_proj.weight"] = normal(KV, E)
            w[p + "self_attn.k_norm.weight"] = norm(HD)
            if not s["k_eq_v"]:
                w[p + "self_attn.v_proj.weight"] = normal(KV, E)
        save(w, f"model-layer{il:03d}.safetensors")
    sh.write_index()


def write_hybrid(directory: Path, name: str) -> None:
    """A hybrid model's Hugging Face checkpoint (float32), through the tests' writers."""
    sys.path.insert(0, str(ROOT))
    spec = dict(HYBRIDS[name])
    kind = spec.pop("kind")
    if kind == "nemotron_h":
        from tests.hf_nemotron_h import write_nemotron_h_hf_model

        write_nemotron_h_hf_model(directory, **spec)
        return
    from tests.hf_qwen3next import hf_config, random_weights, write_hf

    mtp = spec.pop("mtp", False)
    c = hf_config(kind, **spec)
    write_hf(directory, c, random_weights(c, mtp=mtp))


def build(model: str, types: list[str], threads: int) -> list[Path]:
    todo = [t for t in types if not gguf_path(model, t).is_file()]
    done = [gguf_path(model, t) for t in types if t not in todo]
    for p in done:
        print(f"have {p}", file=sys.stderr)
    if not todo:
        return done
    hf = out_dir() / f"{model}-hf"
    if not (hf / "model.safetensors.index.json").is_file():
        shutil.rmtree(hf, ignore_errors=True)
        t0 = time.perf_counter()
        if model in HYBRIDS:
            write_hybrid(hf, model)
        elif model in GEMMA4:
            write_gemma4(hf, model)
        else:
            write_checkpoint(hf, model, MODELS[model])
        print(f"wrote {hf} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    for t in todo:
        out = gguf_path(model, t)
        tmp = out.with_suffix(".partial.gguf")
        cmd = [sys.executable, "-m", "llamacy", "convert", str(hf), "-o", str(tmp), "--type", t]
        cmd += ["--threads", str(threads)]
        print(" ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True, cwd=ROOT)
        tmp.rename(out)
        done.append(out)
    shutil.rmtree(hf)  # every requested type is converted: the f16 checkpoint is no longer needed
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--models", default=DEFAULT_MODELS, help=f"comma list of {', '.join([*MODELS, *HYBRIDS, *GEMMA4])}"
    )
    ap.add_argument("--types", default=DEFAULT_TYPES, help="comma list of llamacy convert --type values")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--list", action="store_true", help="print the files already built and exit")
    args = ap.parse_args(argv)
    if args.list:
        for label, p in built_models():
            print(f"{label}\t{p}")
        return 0
    out_dir().mkdir(parents=True, exist_ok=True)
    for model in [m for m in args.models.split(",") if m]:
        if model not in MODELS and model not in HYBRIDS and model not in GEMMA4:
            raise SystemExit(f"unknown model {model!r}; known: {', '.join([*MODELS, *HYBRIDS, *GEMMA4])}")
        for p in build(model, [t.lower() for t in args.types.split(",") if t], args.threads):
            print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
