"""Tiny random Qwen3-Next (Qwen3NextForCausalLM) and Qwen3.5 text (Qwen3_5ForCausalLM) checkpoints, a numpy
float64 forward pass written from Hugging Face's modeling code (modeling_qwen3_next.py /
modeling_qwen3_5.py: zero-centred RMSNorm x·(1 + w), gated attention with q and gate interleaved per head,
partial rotate_half RoPE, the gated delta-net with torch_recurrent_gated_delta_rule, the sparse MoE block
with its sigmoid-gated shared expert), the multi-token-prediction block's forward pass (vLLM's
Qwen3NextMultiTokenPredictor / Qwen3_5MultiTokenPredictor: hf_mtp_logits), and the GGUF file llama.cpp's
convert_hf_to_gguf.py writes for such a checkpoint (conversion/qwen.py: Qwen3NextModel,
_LinearAttentionVReorderBase, _QwenMtpMixin), its transforms done by hand here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter

from tests.model_factory import _bpe_vocab, _pad_vocab, _write_tokenizer

N_VOCAB = 448  # the tests' trained BPE tokenizer has about 420 tokens


def hf_config(kind: str, **over: Any) -> dict[str, Any]:
    """kind: "qwen3_next" (MoE with a shared expert), "qwen3_5" (dense) or "qwen3_5_moe" (Qwen3.5's layers
    with Qwen3-Next's mixture). All: 6 layers, every third
    full attention (GQA 4:2, head 32, a quarter rotated), delta-net with 2 key heads of 16 and 4 value
    heads of 16 (key heads repeated), convolution width 4."""
    c: dict[str, Any] = {
        "vocab_size": N_VOCAB,
        "hidden_size": 64,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": 96,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "full_attention_interval": 3,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
    }
    if kind != "qwen3_5":
        c.update(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            norm_topk_prob=True,
            decoder_sparse_step=1,
        )
    if kind == "qwen3_next":
        c.update(architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next")
    else:
        moe = kind == "qwen3_5_moe"
        c.update(
            architectures=["Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM"],
            model_type="qwen3_5_moe_text" if moe else "qwen3_5_text",
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [2, 1, 1],
                "mrope_interleaved": True,
            },
        )
    c.update(over)
    return c


def is_attention(c: dict[str, Any], i: int) -> bool:
    return (i + 1) % c["full_attention_interval"] == 0


def random_weights(c: dict[str, Any], seed: int = 0, mtp: bool = False) -> dict[str, np.ndarray]:
    """Checkpoint tensors by Hugging Face name (float32); mtp: with a one-layer MTP block (mtp.*)."""
    rng = np.random.default_rng(seed)
    E, V, F = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    H, HKV, HD = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv, K = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
    moe = "num_experts" in c
    fused = c["model_type"] == "qwen3_next"  # in_proj_qkvz / in_proj_ba; Qwen3.5 projects each apart

    def m(*shape: int, s: float | None = None) -> np.ndarray:
        scale = s if s is not None else 1.0 / np.sqrt(shape[-1])
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def zc(n: int) -> np.ndarray:  # zero-centred norm weights, small
        return (rng.standard_normal(n) * 0.1).astype(np.float32)

    w = {"model.embed_tokens.weight": m(V, E, s=1.0), "model.norm.weight": zc(E), "lm_head.weight": m(V, E)}

    def layer(p: str, attention: bool) -> None:
        w[p + "input_layernorm.weight"] = zc(E)
        w[p + "post_attention_layernorm.weight"] = zc(E)
        if attention:
            w[p + "self_attn.q_proj.weight"] = m(2 * H * HD, E)
            w[p + "self_attn.k_proj.weight"] = m(HKV * HD, E)
            w[p + "self_attn.v_proj.weight"] = m(HKV * HD, E)
            w[p + "self_attn.o_proj.weight"] = m(E, H * HD)
            w[p + "self_attn.q_norm.weight"] = zc(HD)
            w[p + "self_attn.k_norm.weight"] = zc(HD)
        else:
            la = p + "linear_attn."
            if fused:
                w[la + "in_proj_qkvz.weight"] = m(2 * nk * dk + 2 * nv * dv, E)
                w[la + "in_proj_ba.weight"] = m(2 * nv, E)
            else:
                w[la + "in_proj_qkv.weight"] = m(2 * nk * dk + nv * dv, E)
                w[la + "in_proj_z.weight"] = m(nv * dv, E)
                w[la + "in_proj_b.weight"] = m(nv, E)
                w[la + "in_proj_a.weight"] = m(nv, E)
            w[la + "conv1d.weight"] = m(2 * nk * dk + nv * dv, 1, K, s=0.5)
            w[la + "dt_bias"] = (rng.standard_normal(nv) * 0.5).astype(np.float32)
            w[la + "A_log"] = rng.uniform(-1.0, 1.0, nv).astype(np.float32)
            w[la + "norm.weight"] = (1.0 + rng.standard_normal(dv) * 0.1).astype(np.float32)
            w[la + "out_proj.weight"] = m(E, nv * dv)
        if moe:
            NE, FE, FS = c["num_experts"], c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
            w[p + "mlp.gate.weight"] = m(NE, E)
            for e in range(NE):
                w[p + f"mlp.experts.{e}.gate_proj.weight"] = m(FE, E)
                w[p + f"mlp.experts.{e}.up_proj.weight"] = m(FE, E)
                w[p + f"mlp.experts.{e}.down_proj.weight"] = m(E, FE)
            w[p + "mlp.shared_expert.gate_proj.weight"] = m(FS, E)
            w[p + "mlp.shared_expert.up_proj.weight"] = m(FS, E)
            w[p + "mlp.shared_expert.down_proj.weight"] = m(E, FS)
            w[p + "mlp.shared_expert_gate.weight"] = m(1, E)
        else:
            w[p + "mlp.gate_proj.weight"] = m(F, E)
            w[p + "mlp.up_proj.weight"] = m(F, E)
            w[p + "mlp.down_proj.weight"] = m(E, F)

    for i in range(c["num_hidden_layers"]):
        layer(f"model.layers.{i}.", is_attention(c, i))
    if mtp:
        w["mtp.fc.weight"] = m(E, 2 * E)
        for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            w[f"mtp.{n}.weight"] = zc(E)
        layer("mtp.layers.0.", True)
    return w


# -- the Hugging Face forward pass, float64 ---------------------------------------------------------------


def _rms(x: np.ndarray, w: np.ndarray | None, eps: float, zero_centred: bool = True) -> np.ndarray:
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    if w is None:
        return y
    return y * ((1.0 + w) if zero_centred else w)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def _l2norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def _attention(c: dict[str, Any], w: dict[str, np.ndarray], p: str, x: np.ndarray) -> np.ndarray:
    T = x.shape[0]
    H, HKV, HD = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    eps = c["rms_norm_eps"]
    qg = (x @ w[p + "q_proj.weight"].T).reshape(T, H, 2 * HD)
    q, gate = qg[..., :HD], qg[..., HD:].reshape(T, H * HD)
    k = (x @ w[p + "k_proj.weight"].T).reshape(T, HKV, HD)
    v = (x @ w[p + "v_proj.weight"].T).reshape(T, HKV, HD)
    q = _rms(q, w[p + "q_norm.weight"], eps)
    k = _rms(k, w[p + "k_norm.weight"], eps)
    rot = int(HD * c["partial_rotary_factor"])
    theta = c.get("rope_parameters", {}).get("rope_theta", c["rope_theta"])
    inv = 1.0 / theta ** (np.arange(0, rot, 2, dtype=np.float64) / rot)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]

    def rope(t: np.ndarray) -> np.ndarray:
        r, rest = t[..., :rot], t[..., rot:]
        half = np.concatenate([-r[..., rot // 2 :], r[..., : rot // 2]], axis=-1)
        return np.concatenate([r * cos + half * sin, rest], axis=-1)

    q, k = rope(q), rope(k)
    g = H // HKV
    out = np.zeros((T, H, HD))
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for h in range(H):
        s = q[:, h] @ k[:, h // g].T / np.sqrt(HD) + mask
        s = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h] = (s / s.sum(axis=1, keepdims=True)) @ v[:, h // g]
    out = out.reshape(T, H * HD) * _sigmoid(gate)
    return out @ w[p + "o_proj.weight"].T


def _deltanet(c: dict[str, Any], w: dict[str, np.ndarray], p: str, x: np.ndarray) -> np.ndarray:
    T = x.shape[0]
    nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv, K = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
    r = nv // nk
    if p + "in_proj_qkvz.weight" in w:  # Qwen3-Next: [q, k, v, z] per key head; b, a likewise
        qkvz = (x @ w[p + "in_proj_qkvz.weight"].T).reshape(T, nk, 2 * dk + 2 * r * dv)
        q, k = qkvz[..., :dk], qkvz[..., dk : 2 * dk]
        v = qkvz[..., 2 * dk : 2 * dk + r * dv].reshape(T, nv * dv)
        z = qkvz[..., 2 * dk + r * dv :].reshape(T, nv, dv)
        ba = (x @ w[p + "in_proj_ba.weight"].T).reshape(T, nk, 2 * r)
        b, a = ba[..., :r].reshape(T, nv), ba[..., r:].reshape(T, nv)
        mixed = np.concatenate([q.reshape(T, -1), k.reshape(T, -1), v], axis=-1)
    else:  # Qwen3.5: separate projections
        mixed = x @ w[p + "in_proj_qkv.weight"].T
        z = (x @ w[p + "in_proj_z.weight"].T).reshape(T, nv, dv)
        b = x @ w[p + "in_proj_b.weight"].T
        a = x @ w[p + "in_proj_a.weight"].T
    # Causal depthwise convolution (left-padded with zeros), SiLU.
    cw = w[p + "conv1d.weight"][:, 0, :]  # [channels, K]
    padded = np.concatenate([np.zeros((K - 1, mixed.shape[1])), mixed], axis=0)
    conv = np.stack([np.sum(padded[t : t + K].T * cw, axis=1) for t in range(T)])
    conv = _silu(conv)
    q = conv[:, : nk * dk].reshape(T, nk, dk)
    k = conv[:, nk * dk : 2 * nk * dk].reshape(T, nk, dk)
    v = conv[:, 2 * nk * dk :].reshape(T, nv, dv)
    beta = _sigmoid(b)
    g = -np.exp(w[p + "A_log"].astype(np.float64)) * _softplus(a + w[p + "dt_bias"])
    q = np.repeat(q, r, axis=1)  # repeat_interleave: value head h reads key head h // r
    k = np.repeat(k, r, axis=1)
    q = _l2norm(q) / np.sqrt(dk)
    k = _l2norm(k)
    S = np.zeros((nv, dk, dv))
    out = np.zeros((T, nv, dv))
    for t in range(T):
        S = S * np.exp(g[t])[:, None, None]
        kv_mem = np.einsum("hkv,hk->hv", S, k[t])
        delta = (v[t] - kv_mem) * beta[t][:, None]
        S = S + k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hkv,hk->hv", S, q[t])
    y = _rms(out, w[p + "norm.weight"], c["rms_norm_eps"], zero_centred=False) * _silu(z)
    return y.reshape(T, nv * dv) @ w[p + "out_proj.weight"].T


def _ffn(c: dict[str, Any], w: dict[str, np.ndarray], p: str, x: np.ndarray) -> np.ndarray:
    def mlp(q: str, h: np.ndarray) -> np.ndarray:
        return (_silu(h @ w[q + "gate_proj.weight"].T) * (h @ w[q + "up_proj.weight"].T)) @ w[
            q + "down_proj.weight"
        ].T

    if p + "mlp.gate.weight" not in w:
        return mlp(p + "mlp.", x)
    logits = x @ w[p + "mlp.gate.weight"].T
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    k = c["num_experts_per_tok"]
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        top = np.argsort(-probs[t], kind="stable")[:k]
        wt = probs[t, top] / probs[t, top].sum()
        for e, we in zip(top, wt, strict=True):
            out[t] += we * mlp(p + f"mlp.experts.{e}.", x[t : t + 1])[0]
    shared = mlp(p + "mlp.shared_expert.", x) * _sigmoid(x @ w[p + "mlp.shared_expert_gate.weight"].T)
    return out + shared


def _decoder_layer(
    c: dict[str, Any], w: dict[str, np.ndarray], p: str, x: np.ndarray, attention: bool
) -> np.ndarray:
    """One decoder layer (prefix p): norm -> mixer -> residual, post-attention norm -> FFN -> residual."""
    eps = c["rms_norm_eps"]
    h = _rms(x, w[p + "input_layernorm.weight"], eps)
    mixer = _attention(c, w, p + "self_attn.", h) if attention else _deltanet(c, w, p + "linear_attn.", h)
    x = x + mixer
    return x + _ffn(c, w, p, _rms(x, w[p + "post_attention_layernorm.weight"], eps))


def _f64(w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.astype(np.float64) for k, v in w.items()}


def hf_hidden(c: dict[str, Any], w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """The main model's final hidden states [len(ids), hidden] for one sequence, after model.norm (the
    rows lm_head reads and the MTP block starts from), float64."""
    w = _f64(w)
    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    for i in range(c["num_hidden_layers"]):
        x = _decoder_layer(c, w, f"model.layers.{i}.", x, is_attention(c, i))
    return _rms(x, w["model.norm.weight"], c["rms_norm_eps"])


def hf_logits(c: dict[str, Any], w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """Logits [len(ids), vocab] of the checkpoint for one sequence, float64."""
    return hf_hidden(c, w, ids) @ w["lm_head.weight"].astype(np.float64).T


def hf_mtp_hidden(
    c: dict[str, Any], w: dict[str, np.ndarray], ids: list[int], hidden: np.ndarray | None = None
) -> np.ndarray:
    """The MTP block's output rows [len(ids) - 1, hidden] after mtp.norm, float64, as vLLM's
    Qwen3NextMultiTokenPredictor / Qwen3_5MultiTokenPredictor compute them: entry j reads token ids[j + 1]
    and the main model's hidden row j (hf_hidden's, or `hidden`'s: a drafter chains on its own rows),
        x_j = mtp.fc [RMSNorm(embed(ids[j + 1])); RMSNorm(h_j)]      (embedding half first)
    then the full-attention decoder layer mtp.layers.0 over entries 0..j (rotary position j) with the
    model's FFN, then RMSNorm(x; mtp.norm). Row j predicts ids[j + 2]."""
    h = hf_hidden(c, w, ids) if hidden is None else np.asarray(hidden, dtype=np.float64)
    w = _f64(w)
    eps, n = c["rms_norm_eps"], len(ids) - 1
    e = _rms(w["model.embed_tokens.weight"][np.asarray(ids[1:])], w["mtp.pre_fc_norm_embedding.weight"], eps)
    g = _rms(h[:n], w["mtp.pre_fc_norm_hidden.weight"], eps)
    x = np.concatenate([e, g], axis=-1) @ w["mtp.fc.weight"].T
    x = _decoder_layer(c, w, "mtp.layers.0.", x, attention=True)
    return _rms(x, w["mtp.norm.weight"], eps)


def hf_mtp_logits(
    c: dict[str, Any], w: dict[str, np.ndarray], ids: list[int], hidden: np.ndarray | None = None
) -> np.ndarray:
    """The MTP block's logits [len(ids) - 1, vocab] (hf_mtp_hidden's rows through lm_head): row j predicts
    ids[j + 2]."""
    return hf_mtp_hidden(c, w, ids, hidden) @ w["lm_head.weight"].astype(np.float64).T


# -- the files --------------------------------------------------------------------------------------------


def write_hf(directory: Path, c: dict[str, Any], w: dict[str, np.ndarray]) -> Path:
    """config.json, model.safetensors and a byte-level BPE tokenizer (tests/test_convert.py's)."""
    from safetensors.numpy import save_file

    from tests.test_convert import write_bpe_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(c))
    save_file({k: np.ascontiguousarray(v) for k, v in w.items()}, str(directory / "model.safetensors"))
    write_bpe_tokenizer(directory, "qwen2")
    return directory


def _reorder_v(t: np.ndarray, axis: int, nk: int, r: int, hd: int) -> np.ndarray:
    """conversion/qwen.py's _reorder_v_heads: value heads grouped by key head -> tiled order."""
    t = np.moveaxis(t, axis, 0)
    rest = t.shape[1:]
    t = t.reshape(nk, r, hd, *rest).swapaxes(0, 1).reshape(nk * r * hd, *rest)
    return np.moveaxis(t, 0, axis)


def llama_cpp_tensors(c: dict[str, Any], w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The checkpoint's tensors as llama.cpp's converter names and transforms them (float32)."""
    nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    r = nv // nk
    n_layer = c["num_hidden_layers"]
    qwen35 = c["model_type"] != "qwen3_next"
    out: dict[str, np.ndarray] = {}
    names = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "post_attention_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "self_attn.q_norm.weight": "attn_q_norm.weight",
        "self_attn.k_norm.weight": "attn_k_norm.weight",
        "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
        "linear_attn.in_proj_z.weight": "attn_gate.weight",
        "linear_attn.in_proj_ba.weight": "ssm_ba.weight",
        "linear_attn.in_proj_b.weight": "ssm_beta.weight",
        "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
        "linear_attn.conv1d.weight": "ssm_conv1d.weight",
        "linear_attn.dt_bias": "ssm_dt.bias",
        "linear_attn.A_log": "ssm_a",
        "linear_attn.norm.weight": "ssm_norm.weight",
        "linear_attn.out_proj.weight": "ssm_out.weight",
        "mlp.gate.weight": "ffn_gate_inp.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
        "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
        "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
        "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
        "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
        "eh_proj.weight": "nextn.eh_proj.weight",
        "enorm.weight": "nextn.enorm.weight",
        "hnorm.weight": "nextn.hnorm.weight",
        "shared_head.norm.weight": "nextn.shared_head_norm.weight",
    }
    # _QwenMtpMixin.filter_tensors renames the MTP block's own tensors before anything else sees them
    # (mtp.fc.weight -> model.layers.{n_layer}.eh_proj.weight), so all three norms get the "+ 1" below.
    mtp_own = {"fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm",
               "norm": "shared_head.norm"}  # fmt: skip
    experts: dict[str, dict[int, np.ndarray]] = {}
    for name, t in w.items():
        if name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
            gname = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                     "lm_head.weight": "output.weight"}[name]  # fmt: skip
            out[gname] = t + 1.0 if name == "model.norm.weight" else t
            continue
        if name.startswith("mtp.layers."):
            _, _, b, rest = name.split(".", 3)
            bid = n_layer + int(b)
        elif name.startswith("mtp."):
            stem, _, suffix = name.removeprefix("mtp.").partition(".")
            bid, rest = n_layer, f"{mtp_own[stem]}.{suffix}"
        else:
            _, _, b, rest = name.split(".", 3)
            bid = int(b)
        if rest.startswith("mlp.experts."):
            _, _, e, proj, _ = rest.split(".")
            experts.setdefault(f"blk.{bid}.ffn_{proj.removesuffix('_proj')}_exps.weight", {})[int(e)] = t
            continue
        if qwen35 and r > 1 and rest.startswith("linear_attn."):
            if rest.endswith("in_proj_qkv.weight"):
                t = np.concatenate([t[: 2 * nk * dk], _reorder_v(t[2 * nk * dk :], 0, nk, r, dv)])
            elif rest.endswith("in_proj_z.weight"):
                t = _reorder_v(t, 0, nk, r, dv)
            elif rest.endswith(("in_proj_b.weight", "in_proj_a.weight", "dt_bias", "A_log")):
                t = _reorder_v(t, 0, nk, r, 1)
            elif rest.endswith("conv1d.weight"):
                t = np.concatenate([t[: 2 * nk * dk], _reorder_v(t[2 * nk * dk :], 0, nk, r, dv)])
            elif rest.endswith("out_proj.weight"):
                t = _reorder_v(t, 1, nk, r, dv)
        if rest.endswith("A_log"):
            t = -np.exp(t)
        elif rest.endswith("conv1d.weight"):
            t = t[:, 0, :]
        elif rest.endswith("norm.weight") and not rest.endswith("linear_attn.norm.weight"):
            t = t + 1.0
        if rest.endswith("in_proj_qkvz.weight"):
            g = t.reshape(nk, 2 * dk + 2 * r * dv, -1)
            q, k = g[:, :dk], g[:, dk : 2 * dk]
            v, z = g[:, 2 * dk : 2 * dk + r * dv], g[:, 2 * dk + r * dv :]
            E = t.shape[1]
            out[f"blk.{bid}.attn_qkv.weight"] = np.concatenate(
                [q.reshape(-1, E), k.reshape(-1, E), v.reshape(-1, E)]
            )
            out[f"blk.{bid}.attn_gate.weight"] = z.reshape(-1, E)
            continue
        out[f"blk.{bid}.{names[rest]}"] = t
    for gname, by_e in experts.items():
        out[gname] = np.stack([by_e[e] for e in range(len(by_e))])
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def write_llama_cpp_gguf(
    path: Path,
    c: dict[str, Any],
    w: dict[str, np.ndarray],
    legacy: bool = False,
    tensors: dict[str, np.ndarray] | None = None,
) -> Path:
    """The F32 GGUF file convert_hf_to_gguf.py writes (with the MTP block when w has mtp.* tensors).
    legacy: the delta-net's q/k/v/z as one ssm_in in Hugging Face's per-key-head order (older files);
    tensors: these instead of llama_cpp_tensors(c, w) (a damaged file)."""
    qwen35 = c["model_type"] != "qwen3_next"
    arch = ("qwen35moe" if "num_experts" in c else "qwen35") if qwen35 else "qwen3next"
    n_mtp = 1 if any(k.startswith("mtp.") for k in w) else 0
    tensors = dict(llama_cpp_tensors(c, w) if tensors is None else tensors)
    if legacy:
        for name in [n for n in tensors if n.endswith("attn_qkv.weight")]:
            bid = int(name.split(".")[1])
            del tensors[name], tensors[f"blk.{bid}.attn_gate.weight"]
            tensors[f"blk.{bid}.ssm_in.weight"] = w[f"model.layers.{bid}.linear_attn.in_proj_qkvz.weight"]
    wr = GGUFWriter(str(path), arch)
    wr.add_type("model")
    wr.add_name("tiny random " + arch)
    wr.add_context_length(c["max_position_embeddings"])
    wr.add_embedding_length(c["hidden_size"])
    wr.add_block_count(c["num_hidden_layers"] + n_mtp)
    wr.add_feed_forward_length(c["intermediate_size"])
    wr.add_head_count(c["num_attention_heads"])
    wr.add_head_count_kv(c["num_key_value_heads"])
    wr.add_rope_freq_base(10000.0)
    wr.add_layer_norm_rms_eps(c["rms_norm_eps"])
    if "num_experts" in c:
        wr.add_expert_count(c["num_experts"])
        wr.add_expert_used_count(c["num_experts_per_tok"])
        wr.add_expert_feed_forward_length(c["moe_intermediate_size"])
        wr.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
    if qwen35:
        wr.add_rope_dimension_sections([*c["rope_parameters"]["mrope_section"], 0])
    wr.add_key_length(c["head_dim"])
    wr.add_value_length(c["head_dim"])
    wr.add_ssm_conv_kernel(c["linear_conv_kernel_dim"])
    wr.add_ssm_state_size(c["linear_key_head_dim"])
    wr.add_ssm_group_count(c["linear_num_key_heads"])
    wr.add_ssm_time_step_rank(c["linear_num_value_heads"])
    wr.add_ssm_inner_size(c["linear_value_head_dim"] * c["linear_num_value_heads"])
    wr.add_full_attention_interval(c["full_attention_interval"])
    wr.add_rope_dimension_count(int(c["head_dim"] * c["partial_rotary_factor"]))
    if n_mtp:
        wr.add_nextn_predict_layers(n_mtp)
    wr.add_file_type(0)
    vocab = _bpe_vocab("qwen2")
    _pad_vocab(vocab, c["vocab_size"])
    _write_tokenizer(wr, vocab)
    for name, t in tensors.items():
        wr.add_tensor(name, t, raw_dtype=QT.F32)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path
