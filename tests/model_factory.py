"""Tiny random GGUF models, written with the `gguf` package, for fast unit tests of every architecture.

A tiny model is small (64-wide, 2 layers, ~300 tokens) but real: the metadata keys, tensor names, tensor
shapes and tokenizer layout are those that llama.cpp's convert_hf_to_gguf.py writes for the architecture,
so that code which loads a real model loads these too. Weights are random (seeded), scaled so that the
logits are O(1) and their argmax varies with the input.

    write_tiny_model(path, arch="qwen3", wtype=GGMLQuantizationType.Q4_0, n_layer=3, tie_embeddings=True)
    write_tiny_model(path, arch="nemotron", tensors={...})  # given arrays (GGUF names) instead of random

nemotron is written as convert_hf_to_gguf.py's NemotronModel writes it (see _write_metadata and
_random_tensors): LayerNorm weights already holding HF's w + 1, norm biases, no gate, an untied head.

Conventions (as in GGUF): numpy arrays are [out, in]; GGUF lists the shape reversed (ne[0] = in). Matrices
(token_embd and output included) are stored in `wtype`; norms and biases stay F32 (llama.cpp never
quantizes 1-D tensors). K-quants (Q4_K, Q5_K, Q6_K) need every matrix row length to be a multiple of 256:
pass e.g. n_embd=256, n_ff=512, head_dim=64.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter, LlamaFileType, TokenType

ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "nemotron")

# Weight types this factory can write. The legacy types go through gguf.quants.quantize; the K-quants
# through the simple quantizers below (gguf 0.19 can dequantize them but not quantize).
WEIGHT_TYPES = (QT.F32, QT.F16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K)

FILE_TYPE = {
    QT.F32: LlamaFileType.ALL_F32,
    QT.F16: LlamaFileType.MOSTLY_F16,
    QT.Q4_0: LlamaFileType.MOSTLY_Q4_0,
    QT.Q4_1: LlamaFileType.MOSTLY_Q4_1,
    QT.Q5_0: LlamaFileType.MOSTLY_Q5_0,
    QT.Q5_1: LlamaFileType.MOSTLY_Q5_1,
    QT.Q8_0: LlamaFileType.MOSTLY_Q8_0,
    QT.Q4_K: LlamaFileType.MOSTLY_Q4_K_S,
    QT.Q5_K: LlamaFileType.MOSTLY_Q5_K_S,
    QT.Q6_K: LlamaFileType.MOSTLY_Q6_K,
}

# Defaults per architecture. head_dim differs from n_embd / n_head where the real models do too (Qwen3,
# Gemma 3 store an explicit key_length), so that code assuming n_embd == n_head * head_dim fails here.
_COMMON: dict[str, Any] = {
    "n_embd": 64,
    "n_head": 4,
    "n_head_kv": 2,  # grouped-query attention: 2 query heads per KV head
    "n_ff": 128,
    "n_layer": 2,
    "n_ctx": 128,
    "n_vocab": None,  # None: exactly the tokenizer's tokens; larger: padded with <unusedN> tokens
    "n_rot": None,  # llama only: rotary dims < head_dim (partial rotary); None = head_dim
    "rope_scaling_factor": None,  # writes rope.scaling.type = "linear" and rope.scaling.factor
}
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {**_COMMON, "head_dim": 16, "rope_base": 10000.0, "rms_eps": 1e-5, "tie_embeddings": False},
    "qwen2": {**_COMMON, "head_dim": 16, "rope_base": 1000000.0, "rms_eps": 1e-6, "tie_embeddings": False},
    "qwen3": {**_COMMON, "head_dim": 32, "rope_base": 1000000.0, "rms_eps": 1e-6, "tie_embeddings": False},
    "gemma3": {
        **_COMMON,
        "head_dim": 32,
        "n_layer": 6,  # llama.cpp's pattern makes every 6th layer global: layers 0-4 local, 5 global
        "rope_base": 1000000.0,  # global layers; local ones use 10000 (hard-coded in llama.cpp)
        "rms_eps": 1e-6,
        "sliding_window": 8,  # small, so that a 20-token test sequence slides
        "final_logit_softcapping": None,  # Gemma 3 has none; Gemma-2-style files may carry one
        "tie_embeddings": True,  # every released Gemma ties the output head to the embeddings
    },
    "nemotron": {
        **_COMMON,
        "n_layer": 3,
        "head_dim": 16,  # = n_embd / n_head, as convert's rope.dimension_count formula assumes
        "rope_base": 10000.0,
        "norm_eps": 1e-5,  # HF norm_eps: convert writes it as layer_norm_epsilon AND layer_norm_rms_epsilon
        "partial_rotary_factor": 0.5,  # rope.dimension_count = int(factor * n_embd) // n_head
        "attn_bias": False,  # HF attention_bias: q/k/v/o biases (none in the released models)
        "mlp_bias": False,  # HF mlp_bias: up/down biases (none in the released models)
        "tie_embeddings": False,  # llama.cpp's nemotron loader requires output.weight
    },
}


def write_tiny_model(
    path: str | Path,
    arch: str = "llama",
    wtype: QT = QT.Q8_0,
    seed: int = 0,
    tensors: dict[str, np.ndarray] | None = None,
    **hparams: Any,
) -> Path:
    """Write a tiny random model of `arch` with matrices in `wtype`; returns the path.

    hparams (defaults in DEFAULTS): n_embd, n_head, n_head_kv, head_dim, n_ff, n_layer, n_ctx, n_vocab,
    rope_base, rms_eps, tie_embeddings, n_rot (llama), rope_scaling_factor, sliding_window and
    final_logit_softcapping (gemma3), norm_eps, partial_rotary_factor, attn_bias and mlp_bias (nemotron).
    tensors: write these arrays (numpy order, GGUF names, float) instead of random ones; they must have
    exactly the names and shapes the random ones would (checked), so the layout stays llama.cpp's.
    """
    if arch not in DEFAULTS:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHS)}")
    wtype = QT(wtype)
    if wtype not in WEIGHT_TYPES:
        raise ValueError(f"cannot write weights as {wtype.name}; supported: {[t.name for t in WEIGHT_TYPES]}")
    unknown = set(hparams) - set(DEFAULTS[arch])
    if unknown:
        raise TypeError(f"unknown hyper-parameters for {arch}: {sorted(unknown)}")
    hp = {**DEFAULTS[arch], **hparams}
    path = Path(path)
    rng = np.random.default_rng(seed)

    # Gemma, Nemotron: SentencePiece; the others: byte-level BPE with the pre-tokenizer their files name.
    if arch in ("gemma3", "nemotron"):
        vocab = _spm_vocab(arch)
    else:
        vocab = _bpe_vocab("smollm" if arch == "llama" else "qwen2")
    _pad_vocab(vocab, hp["n_vocab"])
    n_vocab = len(vocab["tokens"])

    writer = GGUFWriter(str(path), arch)
    _write_metadata(writer, arch, hp, n_vocab, wtype)
    _write_tokenizer(writer, vocab)
    random = _random_tensors(arch, hp, n_vocab, rng)
    if tensors is not None:
        shapes = {k: v.shape for k, v in random.items()}
        given = {k: np.shape(v) for k, v in tensors.items()}
        if given != shapes:
            raise ValueError(f"tensors must be exactly {shapes}, got {given}")
        random = {k: np.asarray(tensors[k], dtype=np.float32) for k in random}  # llama.cpp's file order
    for name, array in random.items():
        _add_tensor(writer, name, array, wtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# -- metadata ------------------------------------------------------------------------------------------


def _write_metadata(w: GGUFWriter, arch: str, hp: dict[str, Any], n_vocab: int, wtype: QT) -> None:
    """The keys convert_hf_to_gguf.py writes for each architecture (and no others)."""
    n_embd, n_head, head_dim = hp["n_embd"], hp["n_head"], hp["head_dim"]
    w.add_type("model")
    w.add_name(f"Tiny random {arch}")
    w.add_size_label("tiny")
    w.add_context_length(hp["n_ctx"])
    w.add_embedding_length(n_embd)
    w.add_block_count(hp["n_layer"])
    w.add_feed_forward_length(hp["n_ff"])
    w.add_head_count(n_head)
    w.add_head_count_kv(hp["n_head_kv"])
    # TextModel.set_gguf_parameters: rms eps from "rms_norm_eps" or "norm_eps" (Nemotron's key, so its file
    # carries layer_norm_rms_epsilon too, unused by llama.cpp's nemotron).
    w.add_layer_norm_rms_eps(hp["norm_eps"] if arch == "nemotron" else hp["rms_eps"])
    w.add_rope_freq_base(hp["rope_base"])
    if arch == "llama":
        # LlamaModel writes vocab_size and the rotary dimension count (n_embd / n_head unless partial).
        w.add_vocab_size(n_vocab)
        w.add_rope_dimension_count(hp["n_rot"] or head_dim)
        if head_dim != n_embd // n_head:
            w.add_key_length(head_dim)
            w.add_value_length(head_dim)
    elif hp["n_rot"] is not None:
        raise TypeError(f"n_rot (partial rotary) is only written for llama, not {arch}")
    if arch == "nemotron":
        _nemotron_metadata(w, hp, n_vocab)
    if arch in ("qwen3", "gemma3"):
        # Both store head_dim explicitly; it differs from n_embd / n_head in the released models.
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    elif arch == "qwen2" and head_dim != n_embd // n_head:
        raise ValueError("qwen2 has no explicit head_dim: head_dim must equal n_embd / n_head")
    if arch == "gemma3":
        w.add_sliding_window(hp["sliding_window"])
        if hp["final_logit_softcapping"] is not None:
            w.add_final_logit_softcapping(hp["final_logit_softcapping"])
    if hp["rope_scaling_factor"] is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(hp["rope_scaling_factor"])
    w.add_file_type(FILE_TYPE[wtype])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _nemotron_metadata(w: GGUFWriter, hp: dict[str, Any], n_vocab: int) -> None:
    """What NemotronModel.set_gguf_parameters adds to TextModel's keys (convert_hf_to_gguf.py)."""
    n_embd, n_head, head_dim = hp["n_embd"], hp["n_head"], hp["head_dim"]
    rot = int(hp["partial_rotary_factor"] * n_embd) // n_head  # convert's formula, from n_embd not head_dim
    if rot != int(head_dim * hp["partial_rotary_factor"]) or rot % 2:
        raise ValueError(f"rotary dims {rot}: must be even and equal HF's int(head_dim * factor)")
    if hp["tie_embeddings"]:
        raise ValueError("nemotron: llama.cpp requires output.weight (no tied head)")
    # TextModel writes key/value_length whenever the config has head_dim, and NemotronConfig (read through
    # AutoConfig) always has one.
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_vocab_size(n_vocab)
    w.add_layer_norm_eps(hp["norm_eps"])
    w.add_rope_dimension_count(rot)
    if hp["rope_scaling_factor"] is None:  # else LINEAR and the factor, as for the other architectures
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)


# -- tokenizers ----------------------------------------------------------------------------------------


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (space → 'Ġ', newline → 'Ċ', ...)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


# Merges in rank order; each joins two tokens already in the vocabulary into a new one. Enough to spell
# "The capital of France is Paris" and common English pieces in few tokens.
BPE_MERGES = [
    ("Ġ", "t"), ("h", "e"), ("Ġ", "a"), ("i", "n"), ("Ġt", "he"), ("e", "r"), ("o", "n"), ("Ġ", "s"),
    ("r", "e"), ("a", "t"), ("e", "n"), ("Ġ", "w"), ("Ġ", "c"), ("o", "r"), ("i", "s"), ("Ġ", "o"),
    ("Ġ", "b"), ("e", "s"), ("a", "n"), ("Ġ", "f"), ("Ġ", "p"), ("o", "u"), ("a", "l"), ("a", "r"),
    ("Ġa", "n"), ("Ġan", "d"), ("Ġo", "f"), ("i", "t"), ("Ġ", "is"), ("T", "he"),
    ("Ġc", "a"), ("Ġca", "p"), ("Ġcap", "it"), ("Ġcapit", "al"), ("Ġ", "F"), ("ĠF", "r"), ("c", "e"),
    ("ĠFr", "an"), ("ĠFran", "ce"), ("Ġ", "P"), ("ĠP", "ar"), ("ĠPar", "is"), ("Ġ", "Ġ"), ("ĠĠ", "ĠĠ"),
    ("Ċ", "Ċ"),
]  # fmt: skip
BPE_CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _bpe_vocab(pre: str) -> dict[str, Any]:
    """Byte-level BPE: the 256 byte characters (token id = byte value), the merged tokens, then the
    control tokens, as convert_hf_to_gguf.py's _set_vocab_gpt2 lays them out."""
    tokens = [bytes_to_unicode()[b] for b in range(256)]
    merges = []
    for a, b in BPE_MERGES:
        assert a in tokens and b in tokens and a + b not in tokens, (a, b)
        tokens.append(a + b)
        merges.append(f"{a} {b}")
    types = [TokenType.NORMAL] * len(tokens)
    ids = {t: len(tokens) + i for i, t in enumerate(BPE_CONTROL)}
    tokens += BPE_CONTROL
    types += [TokenType.CONTROL] * len(BPE_CONTROL)
    if pre == "smollm":  # SmolLM2: <|im_start|> is BOS, <|im_end|> EOS and padding
        special = {"bos": ids["<|im_start|>"], "eos": ids["<|im_end|>"], "unk": ids["<|endoftext|>"]}
        special["pad"] = ids["<|im_end|>"]
    else:  # Qwen2/3: <|endoftext|> is BOS and padding, <|im_end|> EOS (instruct models)
        special = {"bos": ids["<|endoftext|>"], "eos": ids["<|im_end|>"], "pad": ids["<|endoftext|>"]}
    return {
        "model": "gpt2",
        "pre": pre,
        "tokens": tokens,
        "types": types,
        "merges": merges,
        "scores": None,
        "special": special,
        "add_bos": False,
        "add_space_prefix": False,
        "template": CHATML_TEMPLATE,
    }


# SentencePiece pieces built pairwise, so that merging by score reaches each of them; rank = score order.
SPM_MERGES = [
    ("▁", "t"), ("h", "e"), ("▁t", "he"), ("▁", "a"), ("i", "n"), ("e", "r"), ("o", "n"), ("▁", "s"),
    ("r", "e"), ("a", "t"), ("e", "n"), ("▁", "o"), ("▁o", "f"), ("i", "s"), ("▁", "is"), ("T", "he"),
    ("▁", "c"), ("a", "p"), ("▁c", "ap"), ("i", "t"), ("a", "l"), ("▁cap", "it"), ("▁capit", "al"),
    ("▁", "F"), ("a", "n"), ("▁F", "r"), ("▁Fr", "an"), ("c", "e"), ("▁Fran", "ce"), ("▁", "P"),
    ("a", "r"), ("▁P", "ar"), ("▁Par", "is"), ("▁", "▁"),
]  # fmt: skip
SPM_CHARS = "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-:"
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


NEMOTRON_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{ '<extra_id_0>System\n' + "
    "message['content'] + '\n' }}{% else %}{{ '<extra_id_1>' + message['role'] + '\n' + message['content'] + "
    "'\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<extra_id_1>assistant\n' }}{% endif %}"
)


def _spm_vocab(arch: str = "gemma3") -> dict[str, Any]:
    """A SentencePiece (GGUF "llama") vocabulary laid out like Gemma's (or Nemotron's): specials, the 256
    byte-fallback tokens <0x00>..<0xFF>, single characters, then merged pieces with decreasing scores."""
    if arch == "nemotron":
        # Nemotron's ids: <pad> 0, <unk> 1, <s> 2, </s> 3 (NemotronConfig bos 2 / eos 3; NemotronModel.set_vocab
        # hard-codes pad 0 and unk 1), and the <extra_id_N> turn markers of its chat template.
        tokens = ["<pad>", "<unk>", "<s>", "</s>", "<extra_id_0>", "<extra_id_1>"]
        types = [TokenType.CONTROL, TokenType.UNKNOWN] + [TokenType.CONTROL] * 4
    else:
        tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
        types = [TokenType.CONTROL] * 3 + [TokenType.UNKNOWN] + [TokenType.CONTROL] * 2
    scores = [-1000.0] * len(tokens)  # as in Gemma's file
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [TokenType.BYTE] * 256
    scores += [0.0] * 256
    for i, ch in enumerate(SPM_CHARS):
        tokens.append(ch)
        types.append(TokenType.NORMAL)
        scores.append(-10000.0 - i)  # single characters rank below every merged piece
    for rank, (a, b) in enumerate(SPM_MERGES):
        assert a in tokens and b in tokens and a + b not in tokens, (a, b)
        tokens.append(a + b)
        types.append(TokenType.NORMAL)
        scores.append(-float(rank))
    return {
        "model": "llama",
        "pre": "default",
        "tokens": tokens,
        "types": types,
        "merges": None,
        "scores": scores,
        "special": {"bos": 2, "eos": 3, "unk": 1, "pad": 0}
        if arch == "nemotron"
        else {"bos": 2, "eos": 1, "unk": 3, "pad": 0},
        "add_bos": True,
        "add_space_prefix": False,  # convert_hf_to_gguf sets this for Gemma 3; our Nemotron SPM has none
        "template": NEMOTRON_TEMPLATE if arch == "nemotron" else GEMMA_TEMPLATE,
    }


def _pad_vocab(vocab: dict[str, Any], n_vocab: int | None) -> None:
    """Grow the vocabulary to n_vocab with unused tokens (real files pad to a multiple of 64/128)."""
    if n_vocab is None:
        return
    have = len(vocab["tokens"])
    if n_vocab < have:
        raise ValueError(f"n_vocab must be at least the tokenizer's {have} tokens, got {n_vocab}")
    for i in range(n_vocab - have):
        vocab["tokens"].append(f"<unused{i}>")
        vocab["types"].append(TokenType.UNUSED)
        if vocab["scores"] is not None:
            vocab["scores"].append(-1000.0)


def _write_tokenizer(w: GGUFWriter, vocab: dict[str, Any]) -> None:
    w.add_tokenizer_model(vocab["model"])
    w.add_tokenizer_pre(vocab["pre"])
    w.add_token_list(vocab["tokens"])
    w.add_token_types([int(t) for t in vocab["types"]])
    if vocab["scores"] is not None:
        w.add_token_scores(vocab["scores"])
    if vocab["merges"] is not None:
        w.add_token_merges(vocab["merges"])
    special = vocab["special"]
    w.add_bos_token_id(special["bos"])
    w.add_eos_token_id(special["eos"])
    if "unk" in special:
        w.add_unk_token_id(special["unk"])
    w.add_pad_token_id(special["pad"])
    w.add_add_bos_token(vocab["add_bos"])
    w.add_add_eos_token(False)
    w.add_add_space_prefix(vocab["add_space_prefix"])
    w.add_chat_template(vocab["template"])


# -- tensors -------------------------------------------------------------------------------------------


def _random_tensors(
    arch: str, hp: dict[str, Any], n_vocab: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Random weights in numpy order [out, in], named as GGUF names them, in llama.cpp's file order."""
    n_embd, n_ff, head_dim = hp["n_embd"], hp["n_ff"], hp["head_dim"]
    q_dim, kv_dim = hp["n_head"] * head_dim, hp["n_head_kv"] * head_dim

    def linear(n_out: int, n_in: int) -> np.ndarray:
        # Unit-variance outputs for unit-variance inputs: activations stay O(1) through the layers.
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        # Near 1, not exactly, so that a kernel ignoring the norm weight is caught. (For Gemma this is the
        # stored value, i.e. 1 + w of the checkpoint.)
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def post_norm(n: int) -> np.ndarray:
        # Gemma's post-attention / post-FFN norms set the size of each block's contribution. The tied head
        # favours the input token by a term growing like sqrt(n_embd) (the embedding is scaled by it);
        # weights of 0.5 * sqrt(n_embd) make the blocks outweigh it. At 1, the argmax is the input token
        # itself at ~80% of positions: a degenerate test model.
        return 0.5 * np.sqrt(n) * norm(n)

    def bias(n: int) -> np.ndarray:
        return (0.1 * rng.standard_normal(n)).astype(np.float32)

    if arch == "nemotron":
        return _nemotron_tensors(hp, n_vocab, linear, bias, rng)

    t: dict[str, np.ndarray] = {}
    # Tied heads read logits off the embedding rows: scale them so logits have a standard deviation ~2.
    # Gemma multiplies the looked-up embedding by sqrt(n_embd) again, which brings it back to O(1).
    t["token_embd.weight"] = (2.0 * rng.standard_normal((n_vocab, n_embd)) / np.sqrt(n_embd)).astype(
        np.float32
    )
    for i in range(hp["n_layer"]):
        b = f"blk.{i}."
        t[b + "attn_norm.weight"] = norm(n_embd)
        t[b + "attn_q.weight"] = linear(q_dim, n_embd)
        t[b + "attn_k.weight"] = linear(kv_dim, n_embd)
        t[b + "attn_v.weight"] = linear(kv_dim, n_embd)
        if arch == "qwen2":
            t[b + "attn_q.bias"] = bias(q_dim)
            t[b + "attn_k.bias"] = bias(kv_dim)
            t[b + "attn_v.bias"] = bias(kv_dim)
        if arch in ("qwen3", "gemma3"):
            t[b + "attn_q_norm.weight"] = norm(head_dim)  # one weight vector shared by all heads
            t[b + "attn_k_norm.weight"] = norm(head_dim)
        t[b + "attn_output.weight"] = linear(n_embd, q_dim)
        if arch == "gemma3":
            t[b + "post_attention_norm.weight"] = post_norm(n_embd)
        t[b + "ffn_norm.weight"] = norm(n_embd)
        t[b + "ffn_gate.weight"] = linear(n_ff, n_embd)
        t[b + "ffn_up.weight"] = linear(n_ff, n_embd)
        t[b + "ffn_down.weight"] = linear(n_embd, n_ff)
        if arch == "gemma3":
            t[b + "post_ffw_norm.weight"] = post_norm(n_embd)
    t["output_norm.weight"] = norm(n_embd)
    if not hp["tie_embeddings"]:
        t["output.weight"] = (2.0 * rng.standard_normal((n_vocab, n_embd)) / np.sqrt(n_embd)).astype(
            np.float32
        )
    return t


def _nemotron_tensors(
    hp: dict[str, Any], n_vocab: int, linear: Any, bias: Any, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """llama.cpp's nemotron tensors (src/models/nemotron.cpp, load_arch_tensors). Norm weights are stored as
    convert writes them, w + 1 of the checkpoint: drawn near 1. Norm biases are always there; attention and
    MLP biases only with attn_bias / mlp_bias. Q/K rows are in HF order (convert does not permute them)."""
    n_embd, n_ff, head_dim = hp["n_embd"], hp["n_ff"], hp["head_dim"]
    q_dim, kv_dim = hp["n_head"] * head_dim, hp["n_head_kv"] * head_dim

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def head() -> np.ndarray:
        return (2.0 * rng.standard_normal((n_vocab, n_embd)) / np.sqrt(n_embd)).astype(np.float32)

    t: dict[str, np.ndarray] = {"token_embd.weight": head()}
    for i in range(hp["n_layer"]):
        b = f"blk.{i}."
        t[b + "attn_norm.weight"], t[b + "attn_norm.bias"] = norm(n_embd), bias(n_embd)
        for name, n_out in (("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)):
            t[b + name + ".weight"] = linear(n_out, n_embd)
            if hp["attn_bias"]:
                t[b + name + ".bias"] = bias(n_out)
        t[b + "attn_output.weight"] = linear(n_embd, q_dim)
        if hp["attn_bias"]:
            t[b + "attn_output.bias"] = bias(n_embd)
        t[b + "ffn_norm.weight"], t[b + "ffn_norm.bias"] = norm(n_embd), bias(n_embd)
        t[b + "ffn_up.weight"] = linear(n_ff, n_embd)
        t[b + "ffn_down.weight"] = linear(n_embd, n_ff)
        if hp["mlp_bias"]:
            t[b + "ffn_up.bias"], t[b + "ffn_down.bias"] = bias(n_ff), bias(n_embd)
    t["output_norm.weight"], t["output_norm.bias"] = norm(n_embd), bias(n_embd)
    t["output.weight"] = head()
    return t


def _add_tensor(w: GGUFWriter, name: str, array: np.ndarray, wtype: QT) -> None:
    if array.ndim == 1 or wtype == QT.F32:
        w.add_tensor(name, array.astype(np.float32))
    elif wtype == QT.F16:
        w.add_tensor(name, array.astype(np.float16))
    else:
        block = gguf.GGML_QUANT_SIZES[wtype][0]
        if array.shape[-1] % block:
            raise ValueError(
                f"{name}: rows of {array.shape[-1]} values do not fill {wtype.name} blocks of {block}; "
                f"choose n_embd / n_ff / head_dim multiples of {block}"
            )
        w.add_tensor(name, quantize(array, wtype), raw_dtype=wtype)


def quantize(array: np.ndarray, wtype: QT) -> np.ndarray:
    """Quantize rows of a float32 [rows, n] array; returns the raw blocks as uint8 [rows, bytes]."""
    if wtype in K_QUANTIZERS:
        rows = np.ascontiguousarray(array, dtype=np.float32).reshape(-1, QK_K)
        return K_QUANTIZERS[wtype](rows).reshape(array.shape[0], -1)
    return gguf.quants.quantize(array, wtype)


# -- K-quants ------------------------------------------------------------------------------------------
# Plain round-to-nearest quantizers (llama.cpp searches for better scales; any valid encoding will do for
# tests). Block layouts are ggml's (ggml-common.h); each is checked against gguf.quants.dequantize in
# tests/test_reference.py.

QK_K = 256


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def _pack_scales_k4(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 six-bit scales and 8 six-bit mins → 12 bytes (inverse of ggml's get_scale_min_k4)."""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (mn[:, 0:4] & 63) | ((mn[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 15) | ((mn[:, 4:8] & 15) << 4)
    return out


def _scale_min_k(blocks: np.ndarray, qmax: int) -> tuple[np.ndarray, ...]:
    """Per 32-value sub-block affine params for Q4_K/Q5_K: x ≈ d*sc*q - dmin*m, q in [0, qmax]."""
    sub = blocks.reshape(-1, 8, 32)
    lo = np.minimum(sub.min(axis=2), 0.0)
    scale = (sub.max(axis=2) - lo) / qmax
    d = _f16(scale.max(axis=1) / 63)
    dmin = _f16(-lo.min(axis=1) / 63)
    df, dminf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        # Rounding the scale up keeps every q within [0, qmax] (no clipping error).
        sc = np.where(df > 0, np.clip(np.ceil(scale / df), 0, 63), 0).astype(np.uint8)
        m = np.where(dminf > 0, np.clip(np.rint(-lo / dminf), 0, 63), 0).astype(np.uint8)
        step = (df * sc)[:, :, None]
        q = np.where(step > 0, np.rint((sub + (dminf * m)[:, :, None]) / step), 0)
    q = np.clip(q, 0, qmax).astype(np.uint8).reshape(-1, QK_K)
    return d, dmin, sc, m, q


def _quantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = _scale_min_k(blocks, 15)
    # qs: four chunks of 32 bytes; chunk j holds sub-block 2j in the low nibbles, 2j+1 in the high ones.
    q = q.reshape(-1, 4, 2, 32)
    qs = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(-1, 128)
    return np.concatenate(
        [d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), _pack_scales_k4(sc, m), qs],
        axis=1,
    )


def _quantize_q5_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = _scale_min_k(blocks, 31)
    q = q.reshape(-1, 4, 2, 32)
    lo = q & 15
    qs = (lo[:, :, 0, :] | (lo[:, :, 1, :] << 4)).reshape(-1, 128)
    # qh: bit 2j of byte l = high bit of value l of sub-block 2j; bit 2j+1 the same for sub-block 2j+1.
    hi = (q >> 4).astype(np.uint8)
    qh = np.zeros((q.shape[0], 32), dtype=np.uint8)
    for j in range(4):
        qh |= (hi[:, j, 0, :] << (2 * j)) | (hi[:, j, 1, :] << (2 * j + 1))
    return np.concatenate(
        [d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), _pack_scales_k4(sc, m), qh, qs],
        axis=1,
    )


def _quantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    """x ≈ d * sc[j] * (q - 32) over 16 sub-blocks of 16, q in [0, 63], sc int8."""
    sub = blocks.reshape(-1, 16, 16)
    amax = np.abs(sub).max(axis=2)
    d = _f16(amax.max(axis=1) / 31 / 127)
    df = d.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df > 0, np.clip(np.ceil(amax / 31 / df), 0, 127), 0).astype(np.int8)
        step = (df * sc)[:, :, None]
        q = np.where(step > 0, np.rint(sub / step), 0)
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # [half, quarter, l]
    # Each 128-value half: ql[64] holds low nibbles (values l and l+64 in byte l, l+32 and l+96 in l+32),
    # qh[32] the two high bits of the four values l, l+32, l+64, l+96 at bits 0, 2, 4, 6 of byte l.
    lo, hi = q & 15, q >> 4
    ql = np.concatenate([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], axis=2)
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
    n = blocks.shape[0]
    return np.concatenate(
        [ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8), d.view(np.uint8).reshape(-1, 2)], axis=1
    )


K_QUANTIZERS = {QT.Q4_K: _quantize_q4_k, QT.Q5_K: _quantize_q5_k, QT.Q6_K: _quantize_q6_k}
