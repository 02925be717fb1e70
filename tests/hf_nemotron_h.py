"""Tiny random NemotronHForCausalLM checkpoints (dense and MoE), a float64 numpy forward pass written from
Hugging Face's modeling_nemotron_h.py, and llama.cpp's conversion of a checkpoint done by hand.

    model = write_nemotron_h_hf_model(tmp_path / "nh", moe=True, latent=32)  # HFModel-like: .path .config
    model.logits(ids)                                                          # the HF oracle, float64
    tensors = llama_cpp_tensors(model)   # GGUF name -> array, as convert_hf_to_gguf.py's NemotronHModel writes

The forward follows modeling_nemotron_h.py: NemotronHBlock = residual + mixer(RMSNorm(x)); the Mamba2 mixer's
torch_forward (in_proj -> [gate, xBC, dt]; causal depthwise conv1d with bias, SiLU; dt = softplus(dt +
dt_bias) clamped below at time_step_min; A = -exp(A_log); the selective scan, here in its recurrent form
(the chunked SSD form HF uses for prompts is the same sum reordered); + D·x; Zamba2RMSNormGated: y·SiLU(gate)
then RMSNorm per group; out_proj); attention without RoPE (GQA, scale head_dim^-0.5); NemotronHMLP
down(relu(up x)²); NemotronHMoE: sigmoid router, e_score_correction_bias for the choice, the chosen
sigmoid weights normalised (norm_topk_prob) and scaled (routed_scaling_factor), fc1_latent_proj before the
experts and fc2_latent_proj after, plus the shared expert on the block's input.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFWriter

KINDS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


@dataclass
class NemotronHModel:
    path: Path
    config: dict[str, Any]
    weights: dict[str, np.ndarray]  # float32, as stored

    def logits(self, ids: list[int]) -> np.ndarray:
        return hf_logits(self.config, self.weights, ids)


def write_nemotron_h_hf_model(
    directory: Path,
    *,
    moe: bool = False,
    pattern: str | None = None,
    latent: int | None = None,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    head_dim: int = 16,
    n_ff: int = 128,
    mamba_heads: int = 8,
    mamba_head_dim: int = 16,
    d_state: int = 16,
    n_groups: int = 2,
    d_conv: int = 4,
    n_expert: int = 8,
    n_used: int = 2,
    n_ff_exp: int = 32,
    n_ff_shexp: int = 64,
    seed: int = 0,
    n_vocab: int | None = None,
) -> NemotronHModel:
    from safetensors.numpy import save_file

    from tests.test_convert import n_tokens, write_bpe_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    write_bpe_tokenizer(directory)
    n_vocab = n_vocab or -(-n_tokens(directory) // 8) * 8  # the converter pads the tokenizer to it
    pattern = pattern or ("ME*MEM*E" if moe else "M*M-M*-M")
    cfg: dict[str, Any] = {
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "vocab_size": n_vocab,
        "hidden_size": n_embd, "num_hidden_layers": len(pattern), "hybrid_override_pattern": pattern,
        "num_attention_heads": n_head, "num_key_value_heads": n_head_kv, "head_dim": head_dim,
        "intermediate_size": n_ff, "mlp_hidden_act": "relu2", "mamba_hidden_act": "silu",
        "mamba_num_heads": mamba_heads, "mamba_head_dim": mamba_head_dim, "ssm_state_size": d_state,
        "n_groups": n_groups, "conv_kernel": d_conv, "use_conv_bias": True, "use_bias": False,
        "attention_bias": False, "mlp_bias": False, "layer_norm_epsilon": 1e-5, "time_step_min": 0.001,
        "time_step_max": 0.1, "time_step_limit": [0.0, float("inf")], "chunk_size": 128,
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
        "residual_in_fp32": False, "torch_dtype": "bfloat16",
    }  # fmt: skip
    if moe:
        cfg.update({
            "n_routed_experts": n_expert, "num_experts_per_tok": n_used, "moe_intermediate_size": n_ff_exp,
            "moe_shared_expert_intermediate_size": n_ff_shexp, "n_shared_experts": 1, "n_group": 1,
            "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "moe_latent_size": latent,
        })  # fmt: skip
    (directory / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(seed)

    def lin(n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    di = mamba_heads * mamba_head_dim
    conv = di + 2 * n_groups * d_state
    w: dict[str, np.ndarray] = {
        "backbone.embeddings.weight": (rng.standard_normal((n_vocab, n_embd))).astype(np.float32)
    }
    for i, ch in enumerate(pattern):
        p = f"backbone.layers.{i}."
        w[p + "norm.weight"] = norm(n_embd)
        kind = KINDS[ch]
        if kind == "mamba":
            w[p + "mixer.in_proj.weight"] = lin(2 * di + 2 * n_groups * d_state + mamba_heads, n_embd)
            w[p + "mixer.conv1d.weight"] = (0.5 * rng.standard_normal((conv, 1, d_conv))).astype(np.float32)
            w[p + "mixer.conv1d.bias"] = (0.1 * rng.standard_normal(conv)).astype(np.float32)
            # dt_bias as HF initialises it (inverse softplus of dt in [0.05, 0.5]): softplus(dt + bias) stays
            # well above time_step_min, where HF's torch_forward clamps and llama.cpp does not.
            dt = np.exp(rng.uniform(np.log(0.05), np.log(0.5), mamba_heads))
            w[p + "mixer.dt_bias"] = (dt + np.log(-np.expm1(-dt))).astype(np.float32)
            w[p + "mixer.A_log"] = np.log(rng.uniform(1, 16, mamba_heads)).astype(np.float32)
            w[p + "mixer.D"] = (1.0 + 0.1 * rng.standard_normal(mamba_heads)).astype(np.float32)
            w[p + "mixer.norm.weight"] = norm(di)
            w[p + "mixer.out_proj.weight"] = lin(n_embd, di)
        elif kind == "attention":
            for proj, n_out, n_in in (("q", n_head * head_dim, n_embd), ("k", n_head_kv * head_dim, n_embd),
                                      ("v", n_head_kv * head_dim, n_embd), ("o", n_embd, n_head * head_dim)):  # fmt: skip
                w[p + f"mixer.{proj}_proj.weight"] = lin(n_out, n_in)
        elif kind == "mlp":
            w[p + "mixer.up_proj.weight"] = lin(n_ff, n_embd)
            w[p + "mixer.down_proj.weight"] = lin(n_embd, n_ff)
        else:
            width = latent or n_embd
            w[p + "mixer.gate.weight"] = lin(n_expert, n_embd)
            w[p + "mixer.gate.e_score_correction_bias"] = (0.1 * rng.standard_normal(n_expert)).astype(
                np.float32
            )
            for e in range(n_expert):
                w[p + f"mixer.experts.{e}.up_proj.weight"] = lin(n_ff_exp, width)
                w[p + f"mixer.experts.{e}.down_proj.weight"] = lin(width, n_ff_exp)
            w[p + "mixer.shared_experts.up_proj.weight"] = lin(n_ff_shexp, n_embd)
            w[p + "mixer.shared_experts.down_proj.weight"] = lin(n_embd, n_ff_shexp)
            if latent:
                w[p + "mixer.fc1_latent_proj.weight"] = lin(latent, n_embd)
                w[p + "mixer.fc2_latent_proj.weight"] = lin(n_embd, latent)
    w["backbone.norm_f.weight"] = norm(n_embd)
    w["lm_head.weight"] = (2.0 * rng.standard_normal((n_vocab, n_embd)) / np.sqrt(n_embd)).astype(np.float32)
    save_file(w, str(directory / "model.safetensors"))
    return NemotronHModel(directory, cfg, w)


# -- the Hugging Face forward pass, float64 ---------------------------------------------------------------


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def _mamba(c: dict[str, Any], w: dict[str, np.ndarray], p: str, h: np.ndarray) -> np.ndarray:
    T = h.shape[0]
    nh, hd, ds, ng, K = (
        c["mamba_num_heads"],
        c["mamba_head_dim"],
        c["ssm_state_size"],
        c["n_groups"],
        c["conv_kernel"],
    )
    di = nh * hd
    proj = h @ w[p + "mixer.in_proj.weight"].T
    gate, xbc, dt = proj[:, :di], proj[:, di : 2 * di + 2 * ng * ds], proj[:, 2 * di + 2 * ng * ds :]
    # nn.Conv1d(groups=channels, padding=K-1), the first T outputs: a causal convolution.
    cw, cb = w[p + "mixer.conv1d.weight"][:, 0, :], w[p + "mixer.conv1d.bias"]
    padded = np.concatenate([np.zeros((K - 1, xbc.shape[1])), xbc])
    conv = np.stack([(padded[t : t + K] * cw.T).sum(0) for t in range(T)]) + cb
    xbc = _silu(conv)
    x, B, C = xbc[:, :di], xbc[:, di : di + ng * ds], xbc[:, di + ng * ds :]
    dt = np.maximum(_softplus(dt + w[p + "mixer.dt_bias"]), c["time_step_min"])
    A = -np.exp(w[p + "mixer.A_log"].astype(np.float64))
    D = w[p + "mixer.D"]
    x, B, C = x.reshape(T, nh, hd), B.reshape(T, ng, ds), C.reshape(T, ng, ds)
    rep = nh // ng
    B, C = np.repeat(B, rep, axis=1), np.repeat(C, rep, axis=1)  # repeat_interleave over heads
    S = np.zeros((nh, hd, ds))
    y = np.zeros((T, nh, hd))
    for t in range(T):
        dA = np.exp(dt[t] * A)  # [nh]
        S = S * dA[:, None, None] + (dt[t][:, None, None] * B[t][:, None, :]) * x[t][:, :, None]
        y[t] = (S * C[t][:, None, :]).sum(-1) + D[:, None] * x[t]
    y = y.reshape(T, di) * _silu(gate)
    gs = di // ng
    y = _rms(y.reshape(T, ng, gs), 1.0, c["layer_norm_epsilon"]).reshape(T, di) * w[p + "mixer.norm.weight"]
    return y @ w[p + "mixer.out_proj.weight"].T


def _attention(c: dict[str, Any], w: dict[str, np.ndarray], p: str, h: np.ndarray) -> np.ndarray:
    T, nh, nkv, hd = h.shape[0], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    q = (h @ w[p + "mixer.q_proj.weight"].T).reshape(T, nh, hd)
    k = (h @ w[p + "mixer.k_proj.weight"].T).reshape(T, nkv, hd)
    v = (h @ w[p + "mixer.v_proj.weight"].T).reshape(T, nkv, hd)
    k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
    s = np.einsum("thd,shd->hts", q, k) * hd**-0.5
    s = np.where(np.tril(np.ones((T, T), bool))[None], s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    o = np.einsum("hts,shd->thd", s, v).reshape(T, nh * hd)
    return o @ w[p + "mixer.o_proj.weight"].T


def _mlp(up: np.ndarray, down: np.ndarray, h: np.ndarray) -> np.ndarray:
    return np.maximum(h @ up.T, 0.0) ** 2 @ down.T


def _moe(c: dict[str, Any], w: dict[str, np.ndarray], p: str, h: np.ndarray) -> np.ndarray:
    probs = 1.0 / (1.0 + np.exp(-(h @ w[p + "mixer.gate.weight"].T)))
    choice = probs + w[p + "mixer.gate.e_score_correction_bias"]
    k = c["num_experts_per_tok"]
    lat = h @ w[p + "mixer.fc1_latent_proj.weight"].T if c.get("moe_latent_size") else h
    out = np.zeros_like(lat)
    for t in range(h.shape[0]):
        idx = np.argsort(-choice[t], kind="stable")[:k]
        wt = probs[t, idx]
        if c["norm_topk_prob"]:
            wt = wt / (wt.sum() + 1e-20)
        wt = wt * c["routed_scaling_factor"]
        for e, we in zip(idx, wt, strict=True):
            q = f"{p}mixer.experts.{e}."
            out[t] += we * _mlp(w[q + "up_proj.weight"], w[q + "down_proj.weight"], lat[t])
    if c.get("moe_latent_size"):
        out = out @ w[p + "mixer.fc2_latent_proj.weight"].T
    return out + _mlp(
        w[p + "mixer.shared_experts.up_proj.weight"], w[p + "mixer.shared_experts.down_proj.weight"], h
    )


def hf_logits(c: dict[str, Any], weights: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    eps = c["layer_norm_epsilon"]
    x = w["backbone.embeddings.weight"][np.asarray(ids)]
    for i, ch in enumerate(c["hybrid_override_pattern"]):
        p = f"backbone.layers.{i}."
        h = _rms(x, w[p + "norm.weight"], eps)
        kind = KINDS[ch]
        if kind == "mamba":
            x = x + _mamba(c, w, p, h)
        elif kind == "attention":
            x = x + _attention(c, w, p, h)
        elif kind == "mlp":
            x = x + _mlp(w[p + "mixer.up_proj.weight"], w[p + "mixer.down_proj.weight"], h)
        else:
            x = x + _moe(c, w, p, h)
    return _rms(x, w["backbone.norm_f.weight"], eps) @ w["lm_head.weight"].T


# -- llama.cpp's conversion, by hand ------------------------------------------------------------------------

_NAMES = {
    "norm.weight": "attn_norm.weight", "mixer.in_proj.weight": "ssm_in.weight",
    "mixer.conv1d.weight": "ssm_conv1d.weight", "mixer.conv1d.bias": "ssm_conv1d.bias",
    "mixer.dt_bias": "ssm_dt.bias", "mixer.A_log": "ssm_a", "mixer.D": "ssm_d",
    "mixer.norm.weight": "ssm_norm.weight", "mixer.out_proj.weight": "ssm_out.weight",
    "mixer.q_proj.weight": "attn_q.weight", "mixer.k_proj.weight": "attn_k.weight",
    "mixer.v_proj.weight": "attn_v.weight", "mixer.o_proj.weight": "attn_output.weight",
    "mixer.up_proj.weight": "ffn_up.weight", "mixer.down_proj.weight": "ffn_down.weight",
    "mixer.gate.weight": "ffn_gate_inp.weight", "mixer.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mixer.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mixer.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    "mixer.fc1_latent_proj.weight": "ffn_latent_down.weight", "mixer.fc2_latent_proj.weight": "ffn_latent_up.weight",
}  # fmt: skip


def llama_cpp_tensors(model: NemotronHModel) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array (numpy order), with NemotronHModel.modify_tensors' transforms: A_log ->
    -exp, reshaped [n_head, 1]; D [n_head, 1]; conv1d squeezed [channels, d_conv]; the norm [n_group, -1];
    experts stacked [n_expert, rows, cols]."""
    c, w = model.config, model.weights
    ng = c["n_groups"]
    out: dict[str, np.ndarray] = {"token_embd.weight": w["backbone.embeddings.weight"]}
    for i, ch in enumerate(c["hybrid_override_pattern"]):
        p = f"backbone.layers.{i}."
        for hf, gg in _NAMES.items():
            if p + hf not in w:
                continue
            a = w[p + hf]
            if hf == "mixer.A_log":
                a = (-np.exp(a)).reshape(-1, 1)
            elif hf == "mixer.D":
                a = a.reshape(-1, 1)
            elif hf == "mixer.conv1d.weight":
                a = a[:, 0, :]
            elif hf == "mixer.norm.weight":
                a = a.reshape(ng, -1)
            out[f"blk.{i}.{gg}"] = np.ascontiguousarray(a, dtype=np.float32)
        if KINDS[ch] == "moe":
            for proj, stem in (("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
                out[f"blk.{i}.{stem}.weight"] = np.stack(
                    [w[f"{p}mixer.experts.{e}.{proj}.weight"] for e in range(c["n_routed_experts"])]
                )
    out["output_norm.weight"] = w["backbone.norm_f.weight"]
    out["output.weight"] = w["lm_head.weight"]
    return out


def write_llama_cpp_file(
    model: NemotronHModel, path: Path, tensors: dict[str, np.ndarray] | None = None, mtp: bool = False
) -> Path:
    """NemotronHModel's metadata (set_gguf_parameters through GraniteHybridModel) and tensors, with
    gguf.GGUFWriter; a byte-level BPE vocabulary of the checkpoint's size. mtp (MoE): with a random
    multi-token-prediction block appended, as the converter folds mtp.layers.0/1 into blk.{n_layer}
    (counted in block_count and the per-layer arrays as an attention and MoE layer)."""
    from tests.model_factory import _bpe_vocab, _pad_vocab, _write_tokenizer

    c = model.config
    moe = "n_routed_experts" in c
    arch = "nemotron_h_moe" if moe else "nemotron_h"
    pattern = c["hybrid_override_pattern"] + ("X" if mtp else "")  # X: attention and MoE
    w = GGUFWriter(str(path), arch)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(len(pattern))
    ff = c["moe_intermediate_size"] if moe else c["intermediate_size"]
    w.add_feed_forward_length([ff if ch in "-EX" else 0 for ch in pattern])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv([c["num_key_value_heads"] if ch in "*X" else 0 for ch in pattern])
    w.add_layer_norm_rms_eps(c["layer_norm_epsilon"])
    w.add_layer_norm_eps(c["layer_norm_epsilon"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_rope_scaling_finetuned(False)
    w.add_ssm_conv_kernel(c["conv_kernel"])
    w.add_ssm_state_size(c["ssm_state_size"])
    w.add_ssm_group_count(c["n_groups"])
    w.add_ssm_inner_size(c["mamba_num_heads"] * c["mamba_head_dim"])
    w.add_ssm_time_step_rank(c["mamba_num_heads"])
    w.add_vocab_size(c["vocab_size"])
    if moe:
        w.add_expert_used_count(c["num_experts_per_tok"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(c["moe_shared_expert_intermediate_size"])
        w.add_expert_count(c["n_routed_experts"])
        w.add_expert_shared_count(c["n_shared_experts"])
        w.add_expert_weights_norm(c["norm_topk_prob"])
        w.add_expert_weights_scale(c["routed_scaling_factor"])
        w.add_expert_group_count(c["n_group"])
        if c.get("moe_latent_size"):
            w.add_moe_latent_size(c["moe_latent_size"])
    w.add_file_type(0)
    vocab = _bpe_vocab("smollm")
    _pad_vocab(vocab, c["vocab_size"])
    _write_tokenizer(w, vocab)
    tensors = dict(llama_cpp_tensors(model) if tensors is None else tensors)
    if mtp:
        w.add_nextn_predict_layers(1)
        rng, b, E = np.random.default_rng(9), len(pattern) - 1, c["hidden_size"]
        for name, shape in (("nextn.enorm.weight", (E,)), ("nextn.hnorm.weight", (E,)),
                            ("nextn.eh_proj.weight", (E, 2 * E)), ("nextn.shared_head_norm.weight", (E,)),
                            ("attn_norm.weight", (E,)), ("attn_q.weight", (E, E)), ("attn_post_norm.weight", (E,)),
                            ("ffn_gate_inp.weight", (c["n_routed_experts"], E))):  # fmt: skip
            tensors[f"blk.{b}.{name}"] = rng.standard_normal(shape).astype(np.float32)
    for name, a in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
