"""Tiny random NemotronForCausalLM checkpoints, and llama.cpp's conversion of one done by hand.

The checkpoint is in Hugging Face's layout and conventions (transformers' NemotronConfig key names,
LayerNorm1P weights stored as the offset from 1, norm biases, an untied lm_head, a SentencePiece tokenizer
with Nemotron's special ids). tests/test_convert.py's write_hf_model(dir, "nemotron") comes here.

    model = write_nemotron_hf_model(tmp_path / "nemotron")   # HFModel: .path, .config, .weights, .logits()
    gguf_tensors = llama_cpp_tensors(model.weights)          # GGUF names, +1 folded, as convert writes them
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np

# Nemotron-Mini's turn markers: the converter keeps them as control tokens.
EXTRA_IDS = ["<extra_id_0>", "<extra_id_1>"]
# The checkpoint's norm weights are multiples of this: w + 1 is then exact in float32, so the converter's
# fold adds no rounding and the two float64 oracles can be held to each other at ~1e-12.
NORM_GRID = 2.0**-12


def write_nemotron_spm_tokenizer(directory: Path) -> None:
    """A SentencePiece BPE model with Nemotron's ids (<pad> 0, <unk> 1, <s> 2, </s> 3; NemotronConfig's
    bos 2 / eos 3, and the pad 0 / unk 1 that NemotronModel.set_vocab hard-codes), byte fallback, trained on
    test_convert's corpus."""
    import sentencepiece as spm

    from tests.test_convert import CORPUS

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 4), model_writer=buf, vocab_size=420, model_type="bpe",
        byte_fallback=True, add_dummy_prefix=False, normalization_rule_name="identity",
        remove_extra_whitespaces=False, split_digits=True, allow_whitespace_only_pieces=True,
        pad_id=0, unk_id=1, bos_id=2, eos_id=3, pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>",
        eos_piece="</s>", user_defined_symbols=EXTRA_IDS, hard_vocab_limit=False, minloglevel=2,
    )  # fmt: skip
    (directory / "tokenizer.model").write_bytes(buf.getvalue())
    decoder = {str(4 + i): {"content": t, "special": True} for i, t in enumerate(EXTRA_IDS)}
    template = (
        "{% for message in messages %}{{ '<extra_id_1>' + message['role'] + '\n' + message['content'] + '\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<extra_id_1>Assistant\n' }}{% endif %}"
    )
    config = {
        "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False, "chat_template": template,
        "added_tokens_decoder": decoder,
    }  # fmt: skip
    (directory / "tokenizer_config.json").write_text(json.dumps(config))


def write_nemotron_hf_model(
    directory: Path,
    *,
    dtype: str = "f32",
    n_embd: int = 64,
    n_ff: int = 128,
    n_layer: int = 3,
    n_head: int = 4,
    n_head_kv: int = 2,
    head_dim: int | None = None,
    seed: int = 0,
    **config: Any,
) -> Any:
    """A random NemotronForCausalLM checkpoint; returns test_convert's HFModel. config overrides or adds
    config.json keys (partial_rotary_factor, attention_bias, mlp_bias, norm_eps, ...)."""
    from tests.test_convert import HFModel, n_tokens, save_safetensors, stored_values

    directory.mkdir(parents=True, exist_ok=True)
    write_nemotron_spm_tokenizer(directory)
    n_vocab = -(-n_tokens(directory) // 32) * 32 + 32  # padded, as real configs are
    head_dim = head_dim or n_embd // n_head
    # transformers' NemotronConfig names (configuration_nemotron.py); defaults as there unless tiny.
    cfg: dict[str, Any] = {
        "architectures": ["NemotronForCausalLM"], "model_type": "nemotron", "vocab_size": n_vocab,
        "hidden_size": n_embd, "intermediate_size": n_ff, "num_hidden_layers": n_layer,
        "num_attention_heads": n_head, "head_dim": head_dim, "num_key_value_heads": n_head_kv,
        "hidden_act": "relu2", "max_position_embeddings": 128, "initializer_range": 0.0134, "norm_eps": 1e-5,
        "use_cache": True, "bos_token_id": 2, "eos_token_id": 3, "tie_word_embeddings": False,
        "rope_theta": 10000.0, "rope_scaling": None, "partial_rotary_factor": 0.5, "attention_bias": False,
        "attention_dropout": 0.0, "mlp_bias": False, "torch_dtype": "bfloat16",
    }  # fmt: skip
    cfg.update(config)
    (directory / "config.json").write_text(json.dumps(cfg))

    rng = np.random.default_rng(seed)
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim

    def linear(n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def norm_weight(n: int) -> np.ndarray:
        # Near 0 (LayerNorm1P computes with w + 1), not 0: a kernel that drops the weight is caught.
        return (np.round(0.1 * rng.standard_normal(n) / NORM_GRID) * NORM_GRID).astype(np.float32)

    def bias(n: int) -> np.ndarray:
        return (0.1 * rng.standard_normal(n)).astype(np.float32)

    def head() -> np.ndarray:
        return (2.0 * rng.standard_normal((n_vocab, n_embd)) / np.sqrt(n_embd)).astype(np.float32)

    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": head()}
    for i in range(n_layer):
        p = f"model.layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            w[p + norm + ".weight"], w[p + norm + ".bias"] = norm_weight(n_embd), bias(n_embd)
        for proj, n_out, n_in in (("q", q_dim, n_embd), ("k", kv_dim, n_embd), ("v", kv_dim, n_embd),
                                  ("o", n_embd, q_dim)):  # fmt: skip
            w[p + f"self_attn.{proj}_proj.weight"] = linear(n_out, n_in)
            if cfg["attention_bias"]:
                w[p + f"self_attn.{proj}_proj.bias"] = bias(n_out)
        w[p + "mlp.up_proj.weight"] = linear(n_ff, n_embd)
        w[p + "mlp.down_proj.weight"] = linear(n_embd, n_ff)
        if cfg["mlp_bias"]:
            w[p + "mlp.up_proj.bias"], w[p + "mlp.down_proj.bias"] = bias(n_ff), bias(n_embd)
    w["model.norm.weight"], w["model.norm.bias"] = norm_weight(n_embd), bias(n_embd)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = head()
    save_safetensors(w, directory / "model.safetensors", dtype)
    return HFModel(directory, cfg, {k: stored_values(v, dtype) for k, v in w.items()})


# Hugging Face name -> GGUF name, per layer, as gguf-py's tensor_mapping.py maps them for MODEL_ARCH.NEMOTRON
# (MODEL_TENSORS[NEMOTRON]: attn_norm, attn_q/k/v, attn_output, ffn_norm, ffn_up, ffn_down).
LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
GLOBAL_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def llama_cpp_tensors(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The checkpoint's tensors as convert_hf_to_gguf.py's NemotronModel writes them: renamed, and
    modify_tensors adds 1 to every tensor whose name ends in "norm.weight" (input_layernorm,
    post_attention_layernorm, model.norm); biases and matrices unchanged, Q/K not permuted."""
    out: dict[str, np.ndarray] = {}
    for name, value in weights.items():
        stem, suffix = name.rsplit(".", 1)
        if stem in GLOBAL_NAMES:
            gguf_name = f"{GLOBAL_NAMES[stem]}.{suffix}"
        else:
            _, _, layer, part = stem.split(".", 3)
            gguf_name = f"blk.{layer}.{LAYER_NAMES[part]}.{suffix}"
        out[gguf_name] = value + np.float32(1.0) if name.endswith("norm.weight") else value
    return out
