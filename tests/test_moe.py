"""Mixture-of-experts models (qwen3moe, qwen2moe, Mixtral-style llama): conversion and the engine's forward.

The oracle is tests/reference/hf_moe_numpy.py on the ORIGINAL checkpoint weights (one matrix per expert,
Hugging Face conventions). Tiny random checkpoints are written here as the dense ones are in
tests/test_convert.py (whose checkpoint helpers this reuses), converted by `llamacy convert`, then run
through single-token decode, prefill, and batched steps of several sequences.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from llamacy.convert import convert
from llamacy.errors import UnsupportedModelError
from llamacy.gguf import GGUFFile
from tests.reference.hf_moe_numpy import hf_moe_logits, routing_margins
from tests.test_convert import IDS, n_tokens, rel_rms, save_safetensors, stored_values, write_bpe_tokenizer

ARCHS = ("qwen3moe", "qwen2moe", "mixtral")
MODEL_TYPE = {"qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe", "mixtral": "mixtral"}
HF_CLASS = {
    "qwen3moe": "Qwen3MoeForCausalLM",
    "qwen2moe": "Qwen2MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
}
GGUF_ARCH = {"qwen3moe": "qwen3moe", "qwen2moe": "qwen2moe", "mixtral": "llama"}


class MoEModel:
    def __init__(self, path: Path, config: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
        self.path, self.config, self.weights = path, config, weights

    def logits(self, ids: list[int]) -> np.ndarray:
        return hf_moe_logits(self.config, self.weights, ids)


def write_hf_moe_model(
    directory: Path,
    arch: str,
    *,
    dtype: str = "f32",
    n_embd: int = 64,
    n_ff_exp: int = 32,
    n_expert: int = 8,
    n_used: int = 2,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    seed: int = 0,
    clear_routing: bool = False,
    **config: Any,
) -> MoEModel:
    """A random checkpoint of `arch` in Hugging Face's layout: one matrix per expert.

    clear_routing: every layer's router shares one set of expert directions and each token's embedding leans
    towards n_used of them, so that every routing choice has a wide margin (see routing_margins) and
    8-bit rounding cannot flip one; otherwise the routers are independent and near ties occur."""
    directory.mkdir(parents=True, exist_ok=True)
    write_bpe_tokenizer(directory, "qwen2" if arch.startswith("qwen") else "smollm")
    n_vocab = -(-n_tokens(directory) // 32) * 32 + 32
    head_dim = 32 if arch == "qwen3moe" else n_embd // n_head
    cfg: dict[str, Any] = {
        "architectures": [HF_CLASS[arch]], "model_type": MODEL_TYPE[arch], "hidden_size": n_embd,
        "num_hidden_layers": n_layer, "num_attention_heads": n_head, "num_key_value_heads": n_head_kv,
        "vocab_size": n_vocab, "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "num_experts_per_tok": n_used,
        "torch_dtype": "bfloat16",
    }  # fmt: skip
    if arch == "mixtral":
        cfg.update(num_local_experts=n_expert, intermediate_size=n_ff_exp, rms_norm_eps=1e-5)
    else:
        cfg.update(num_experts=n_expert, moe_intermediate_size=n_ff_exp, intermediate_size=4 * n_ff_exp,
                   decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=arch == "qwen3moe")  # fmt: skip
    if arch == "qwen3moe":
        cfg["head_dim"] = head_dim
    if arch == "qwen2moe":
        cfg["shared_expert_intermediate_size"] = 2 * n_ff_exp
    cfg.update(config)
    (directory / "config.json").write_text(json.dumps(cfg))

    rng = np.random.default_rng(seed)
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim

    def linear(n_out: int, n_in: int, scale: float = 1.0) -> np.ndarray:
        return (scale * rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": linear(n_vocab, n_embd, 2.0)}
    directions = rng.standard_normal((n_expert, n_embd))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    if clear_routing:
        for t in range(n_vocab):
            chosen = rng.choice(n_expert, n_used, replace=False)
            w["model.embed_tokens.weight"][t] += 6.0 * directions[chosen].sum(axis=0)
    for i in range(n_layer):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(n_embd)
        w[p + "self_attn.q_proj.weight"] = linear(q_dim, n_embd)
        w[p + "self_attn.k_proj.weight"] = linear(kv_dim, n_embd)
        w[p + "self_attn.v_proj.weight"] = linear(kv_dim, n_embd)
        w[p + "self_attn.o_proj.weight"] = linear(n_embd, q_dim)
        if arch == "qwen2moe":
            for proj, n in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
                w[p + f"self_attn.{proj}_proj.bias"] = (0.1 * rng.standard_normal(n)).astype(np.float32)
        if arch == "qwen3moe":
            w[p + "self_attn.q_norm.weight"] = norm(head_dim)
            w[p + "self_attn.k_norm.weight"] = norm(head_dim)
        w[p + "post_attention_layernorm.weight"] = norm(n_embd)
        # A router with spread-out logits, so that the top-k choice is clear and not a near tie.
        moe = p + ("block_sparse_moe." if arch == "mixtral" else "mlp.")
        w[moe + "gate.weight"] = linear(n_expert, n_embd, 3.0)
        if clear_routing:
            w[moe + "gate.weight"] = (0.2 * w[moe + "gate.weight"] + 3.0 * directions).astype(np.float32)
        names = ("w1", "w3", "w2") if arch == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        for e in range(n_expert):
            ex = f"{moe}experts.{e}."
            w[ex + names[0] + ".weight"] = linear(n_ff_exp, n_embd)
            w[ex + names[1] + ".weight"] = linear(n_ff_exp, n_embd)
            w[ex + names[2] + ".weight"] = linear(n_embd, n_ff_exp)
        if arch == "qwen2moe":
            fs = cfg["shared_expert_intermediate_size"]
            w[moe + "shared_expert.gate_proj.weight"] = linear(fs, n_embd)
            w[moe + "shared_expert.up_proj.weight"] = linear(fs, n_embd)
            w[moe + "shared_expert.down_proj.weight"] = linear(n_embd, fs)
            w[moe + "shared_expert_gate.weight"] = linear(1, n_embd)
    w["model.norm.weight"] = norm(n_embd)
    w["lm_head.weight"] = linear(n_vocab, n_embd, 2.0)
    save_safetensors(w, directory / "model.safetensors", dtype)
    return MoEModel(directory, cfg, {k: stored_values(v, dtype) for k, v in w.items()})


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, MoEModel]:
    """Independent routers (near ties included), every source dtype."""
    root = tmp_path_factory.mktemp("moe")
    dtypes = {"qwen3moe": "f32", "qwen2moe": "bf16", "mixtral": "f16"}
    return {a: write_hf_moe_model(root / a, a, dtype=dtypes[a], seed=i) for i, a in enumerate(ARCHS)}


@pytest.fixture(scope="module")
def clear_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, MoEModel]:
    """Wide routing margins, for the quantized comparisons."""
    root = tmp_path_factory.mktemp("moe-clear")
    return {a: write_hf_moe_model(root / a, a, clear_routing=True) for a in ARCHS}


@pytest.fixture(scope="module")
def converted(moe_models, clear_models, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple, Path]:
    root = tmp_path_factory.mktemp("moe-gguf")
    out = {}
    for arch in ARCHS:
        for models, qtypes in ((moe_models, ("f32",)), (clear_models, ("f16", "q8_0"))):
            for qtype in qtypes:
                out[arch, qtype] = root / f"{arch}-{qtype}.gguf"
                convert(models[arch].path, out[arch, qtype], qtype, threads=1)
    return out


def load(path: Path, n_seq: int = 1, threads: int = 1) -> Any:
    from llamacy.model import Model

    return Model(GGUFFile(path), n_ctx=64, n_threads=threads, n_seq=n_seq, kv_type="f32")


def prefill_then_decode(path: Path) -> np.ndarray:
    """Logits of IDS: the first 12 as one prompt, then one token at a time."""
    m = load(path, threads=2)
    return np.concatenate([m.eval(IDS[:12], logits="all"), *(m.eval([t])[None] for t in IDS[12:])])


@pytest.mark.parametrize("arch", ARCHS)
def test_float32_matches_hugging_face(moe_models, converted, arch: str) -> None:
    want = moe_models[arch].logits(IDS)
    got = prefill_then_decode(converted[arch, "f32"])
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4
    assert (got.argmax(-1) == want.argmax(-1)).all()


# Relative RMS bounds against the oracle, those of the dense models (tests/test_convert.py's HF_BOUNDS).
QUANT_BOUNDS = {"f16": 2e-3, "q8_0": 0.06}


@pytest.mark.parametrize("qtype", list(QUANT_BOUNDS))
@pytest.mark.parametrize("arch", ARCHS)
def test_quantized_matches_hugging_face(clear_models, converted, arch: str, qtype: str) -> None:
    model = clear_models[arch]
    # The premise: no routing choice of this checkpoint is close enough to a tie for rounding to flip it.
    assert routing_margins(model.config, model.weights, IDS).min() > 0.2
    want = model.logits(IDS)
    got = prefill_then_decode(converted[arch, qtype])
    err = rel_rms(got, want)
    assert err < QUANT_BOUNDS[qtype], f"{arch} {qtype}: relative RMS error {err:.2e}"


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_sequences_equal_solo(converted, arch: str) -> None:
    """Several sequences stepped together (their tokens grouped by expert) give each one's solo logits,
    bit for bit; and a prompt in one piece the same as token by token, on one thread as on two."""
    prompts = [IDS[:7], IDS[5:9], IDS[9:20]]
    path = converted[arch, "q8_0"]
    solo = []
    for p in prompts:
        m = load(path, threads=2)
        solo.append(np.stack([m.eval([t]) for t in p]))
        assert np.array_equal(solo[-1][-1], load(path, threads=2).eval(p))  # a prompt in one piece
        assert np.array_equal(solo[-1][-1], load(path, threads=1).eval(p))  # and on one thread
    batch = load(path, n_seq=3, threads=2)
    steps = max(len(p) for p in prompts)
    for s in range(steps):
        live = [i for i, p in enumerate(prompts) if s < len(p)]
        tok = np.array([prompts[i][s] for i in live], np.int32)
        out = batch.eval_batch(tok, np.full(len(live), s, np.int32), np.array(live, np.int32),
                               np.arange(len(live), dtype=np.int32))  # fmt: skip
        for row, i in enumerate(live):
            assert np.array_equal(out[row], solo[i][s]), (arch, i, s)


def _arch_names(arch: str) -> set[str]:
    a = gguf.MODEL_ARCH[arch.upper()]
    return {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[a]}


@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_names_and_keys_are_the_gguf_packages(moe_models, converted, arch: str) -> None:
    f = GGUFFile(converted[arch, "f32"])
    a, cfg = GGUF_ARCH[arch], moe_models[arch].config
    allowed = _arch_names(a)
    for name in f.tensors:
        stem = name.rsplit(".", 1)[0]
        generic = stem if not stem.startswith("blk.") else "blk.{bid}." + stem.split(".", 2)[2]
        assert generic in allowed, name
    n_expert = cfg.get("num_experts", cfg.get("num_local_experts"))
    keys = gguf.Keys.LLM
    md = f.metadata
    assert md["general.architecture"] == a
    assert md[keys.EXPERT_COUNT.format(arch=a)] == n_expert
    assert md[keys.EXPERT_USED_COUNT.format(arch=a)] == cfg["num_experts_per_tok"]
    ff_exp = cfg.get("moe_intermediate_size", cfg["intermediate_size"])
    if arch != "mixtral":
        assert md[keys.EXPERT_FEED_FORWARD_LENGTH.format(arch=a)] == ff_exp
    if arch == "qwen2moe":
        key = keys.EXPERT_SHARED_FEED_FORWARD_LENGTH.format(arch=a)
        assert md[key] == cfg["shared_expert_intermediate_size"]
        assert f.tensors["blk.0.ffn_gate_inp_shexp.weight"].shape == (cfg["hidden_size"],)
    # The 3-D experts, read back by the gguf package itself: [n_expert, rows, cols] in numpy order.
    reader = gguf.GGUFReader(converted[arch, "f32"])
    t = {t.name: t for t in reader.tensors}
    E = cfg["hidden_size"]
    assert tuple(t["blk.1.ffn_gate_exps.weight"].data.shape) == (n_expert, ff_exp, E)
    assert tuple(t["blk.1.ffn_down_exps.weight"].data.shape) == (n_expert, E, ff_exp)
    assert t["blk.0.ffn_gate_inp.weight"].tensor_type == QT.F32
    # Expert 3's down projection is the checkpoint's, in place in the stack.
    moe = "block_sparse_moe" if arch == "mixtral" else "mlp"
    down = "w2" if arch == "mixtral" else "down_proj"
    hf = moe_models[arch].weights[f"model.layers.1.{moe}.experts.3.{down}.weight"]
    assert np.allclose(np.asarray(t["blk.1.ffn_down_exps.weight"].data)[3], hf, rtol=0, atol=0)


def test_router_settings_llama_cpp_cannot_run_are_refused(tmp_path) -> None:
    model = write_hf_moe_model(tmp_path / "m", "qwen3moe", norm_topk_prob=False)
    with pytest.raises(UnsupportedModelError, match="norm_topk_prob"):
        convert(model.path, tmp_path / "out.gguf", "f32")
    model = write_hf_moe_model(tmp_path / "d", "qwen2moe", mlp_only_layers=[1])
    with pytest.raises(UnsupportedModelError, match="dense layers"):
        convert(model.path, tmp_path / "out.gguf", "f32")


# ---------------------------------------------------------------------------------------------------------
# Every target type, llama-quantize's expert rules, and `llamacy info`


def _moe_specs(n_layer: int, n_expert: int, shared: bool = False, E: int = 4096, F: int = 14336) -> list:
    from llamacy.convert.mixtures import TensorSpec

    specs = [TensorSpec("token_embd.weight", (32000, E), QT.F32)]
    for i in range(n_layer):
        layer = [("attn_norm.weight", (E,)), ("attn_q.weight", (E, E)), ("attn_k.weight", (1024, E)),
                 ("attn_v.weight", (1024, E)), ("attn_output.weight", (E, E)), ("ffn_norm.weight", (E,)),
                 ("ffn_gate_inp.weight", (n_expert, E)), ("ffn_gate_exps.weight", (n_expert, F, E)),
                 ("ffn_up_exps.weight", (n_expert, F, E)), ("ffn_down_exps.weight", (n_expert, E, F))]  # fmt: skip
        if shared:
            layer += [("ffn_gate_shexp.weight", (F, E)), ("ffn_down_shexp.weight", (E, F))]
        specs += [TensorSpec(f"blk.{i}.{n}", s, QT.F32) for n, s in layer]
    specs.append(TensorSpec("output_norm.weight", (E,), QT.F32))
    specs.append(TensorSpec("output.weight", (32000, E), QT.F32))
    return specs


def _moe_types(specs: list, qtype: str, n_expert: int, n_layer: int) -> dict[str, str]:
    from llamacy.convert.mixtures import ModelFacts, choose_types, target

    facts = ModelFacts("llama", n_layer, 32, 8, n_expert)
    return {s.name: QT(t).name for s, t in zip(specs, choose_types(specs, target(qtype), facts), strict=True)}


def test_mixture_rules_for_experts() -> None:
    # Mixtral-8x7B (32 layers, 8 experts): llama.cpp's 8-expert bumps; ffn_down_exps by the layer in its name.
    t = _moe_types(_moe_specs(32, 8), "q4_k_m", 8, 32)
    more = [i for i in range(32) if i < 4 or i >= 28 or (i - 4) % 3 == 2]  # use_more_bits
    for i in range(32):
        assert t[f"blk.{i}.attn_v.weight"] == "Q8_0" and t[f"blk.{i}.attn_k.weight"] == "Q8_0"
        assert t[f"blk.{i}.attn_output.weight"] == "Q5_K" and t[f"blk.{i}.attn_q.weight"] == "Q4_K"
        assert t[f"blk.{i}.ffn_down_exps.weight"] == ("Q6_K" if i in more else "Q4_K"), i
        assert t[f"blk.{i}.ffn_gate_exps.weight"] == "Q4_K" and t[f"blk.{i}.ffn_up_exps.weight"] == "Q4_K"
        assert t[f"blk.{i}.ffn_gate_inp.weight"] == "F32"  # the router is never quantized
    assert _moe_types(_moe_specs(32, 8), "q8_0", 8, 32)["blk.0.attn_output.weight"] == "Q8_0"
    # 128 experts plus shared ones (Qwen-style): no 8-expert bumps; both ffn_down tensors of a layer follow it.
    t = _moe_types(_moe_specs(48, 128, shared=True, F=768), "q4_k_m", 128, 48)
    more = [i for i in range(48) if i < 6 or i >= 42 or (i - 6) % 3 == 2]
    for i in range(48):
        want = "Q6_K" if i in more else "Q4_K"
        assert t[f"blk.{i}.ffn_down_exps.weight"] == want and t[f"blk.{i}.ffn_down_shexp.weight"] == want
        assert t[f"blk.{i}.attn_v.weight"] == want and t[f"blk.{i}.attn_k.weight"] == "Q4_K"
        assert t[f"blk.{i}.attn_output.weight"] == "Q4_K"


def test_every_target_type(clear_models, tmp_path) -> None:
    """Each `--type` converts a mixture and runs it, within the bounds the dense models' requantization
    meets (tests/test_convert.py; 64-wide rows take llama.cpp's fallbacks for the K types)."""
    from llamacy.convert.mixtures import TARGETS
    from tests.test_convert import REQUANT_BOUNDS, REQUANT_BOUNDS_K

    model = clear_models["qwen2moe"]
    want = model.logits(IDS)
    bounds = {"f32": 1e-4, **REQUANT_BOUNDS, **REQUANT_BOUNDS_K}
    for qtype in TARGETS:
        out = tmp_path / f"{qtype}.gguf"
        convert(model.path, out, qtype, threads=2)
        err = rel_rms(load(out).eval(IDS, logits="all"), want)
        assert err < bounds[qtype], f"{qtype}: {err:.3g}"
        out.unlink()


def test_k_quant_experts(tmp_path) -> None:
    """Rows of 256: the experts take real K-quant blocks (Q4_K, Q6_K on the use_more_bits layers)."""
    model = write_hf_moe_model(tmp_path / "m", "qwen3moe", n_embd=256, n_ff_exp=256, clear_routing=True)
    out = tmp_path / "q4km.gguf"
    convert(model.path, out, "q4_k_m")
    f = GGUFFile(out)
    assert QT(f.tensors["blk.0.ffn_gate_exps.weight"].type) == QT.Q4_K
    assert QT(f.tensors["blk.1.ffn_down_exps.weight"].type) == QT.Q6_K  # use_more_bits(1, 2)
    assert QT(f.tensors["blk.0.ffn_down_exps.weight"].type) == QT.Q4_K
    err = rel_rms(load(out, threads=2).eval(IDS, logits="all"), model.logits(IDS))
    assert err < 0.41, err  # REQUANT_BOUNDS_K["q4_k_m"]


def test_info_shows_experts_and_what_a_token_reads(moe_models, converted, tmp_path) -> None:
    from llamacy.cli.info import describe

    d = describe(str(converted["qwen2moe", "f32"]), 32)
    cfg = moe_models["qwen2moe"].config
    assert d["experts"] == {"total": 8, "used": 2}
    E, F, L = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["num_hidden_layers"]
    # 6 of the 8 experts' three matrices (f32: 4 bytes a value) are mapped but not read by a token.
    unread = L * 6 * 3 * E * F
    assert d["parameters"] - d["active_parameters"] == unread
    assert d["memory"]["weights"] - d["memory"]["read_per_token"] == 4 * unread
    assert d["memory"]["total"] == d["memory"]["weights"] + d["memory"]["kv_cache"]
    from tests.model_factory import write_tiny_model

    dense = describe(str(write_tiny_model(tmp_path / "dense.gguf", "qwen3")), 32)
    assert dense["experts"] is None and dense["active_parameters"] == dense["parameters"]
    assert dense["memory"]["read_per_token"] == dense["memory"]["weights"]
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "llamacy", "info", str(converted["mixtral", "f32"])],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "8 a layer, 2 used per token" in r.stdout and "per token" in r.stdout


@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.Q8_0])
def test_shared_expert_gate_as_stored(qtype: QT) -> None:
    """ffn_gate_inp_shexp as llama.cpp's files may hold it: an n_embd vector or a [1, n_embd] matrix,
    F32, F16, or quantized by llama-quantize (2-D, not the router)."""
    from types import SimpleNamespace

    from gguf.quants import quantize

    from llamacy.model.config import ModelConfig
    from llamacy.model.weights import WeightBinder

    v = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    data = np.frombuffer(quantize(v.reshape(1, 64), qtype).tobytes(), np.uint8)
    for shape in ((64,), (1, 64)):
        t = SimpleNamespace(data=data, type=int(qtype), shape=shape, n_bytes=data.size)
        cfg = ModelConfig("qwen2moe", "", 8, 8, 64, 1, 4, 2, 16, 128, 16, 1e-6, 1e4)
        binder = WeightBinder(SimpleNamespace(tensors={"g": t}, path="f.gguf"), cfg)
        want = v if qtype == QT.F32 else v.astype(np.float16).astype(np.float32)
        got = binder.vector("g", 64)
        if qtype == QT.Q8_0:
            assert np.abs(got - v).max() < 0.02 * np.abs(v).max()
        else:
            assert np.array_equal(got, want)


@pytest.mark.parametrize(
    ("qtype", "width", "types"),
    [
        ("q4_0", 64, {QT.Q4_0}),
        ("q4_1", 64, {QT.Q4_1}),
        ("q5_0", 64, {QT.Q5_0}),
        ("q8_0", 64, {QT.Q8_0}),
        ("q4_k_m", 256, {QT.Q4_K, QT.Q6_K}),
        ("q5_k_m", 256, {QT.Q5_K, QT.Q6_K}),
    ],
)
def test_repacked_experts_give_the_stored_bits(tmp_path, monkeypatch, qtype, width, types) -> None:
    """Where the VNNI kernels are on and the weights are repacked at load, the expert stacks are repacked into
    8-row tiles like the dense matrices (repack.experts_repackable), and the logits are bit for bit those of
    the stored experts: whole prompt, micro-batches and one token at a time, 1 and 2 threads. A deferred
    repacking leaves the stacks to idle time (evaluations pack the dense matrices only), and packs them when
    asked, with the same bits before and after; on AVX2 alone they stay stored."""
    from llamacy.kernels.matmul import tiles_available
    from llamacy.kernels.repack import LAYOUT_STORED, tile_layout

    from llamacy.engine import Llama
    from llamacy.model.repack import experts_repackable

    model = write_hf_moe_model(tmp_path / "m", "qwen3moe", n_embd=width, n_ff_exp=width, clear_routing=True)
    path = tmp_path / f"{qtype}.gguf"
    convert(model.path, path, qtype, threads=2)
    stacks = [n for n in GGUFFile(path).tensors if "_exps" in n]
    assert {QT(GGUFFile(path).tensors[n].type) for n in stacks} == types
    ids = IDS[:20]
    monkeypatch.setenv("LLAMACY_REPACK", "0")
    stored = Llama(str(path), n_threads=1, kv_type="f32")
    want = stored.logits(ids)
    assert _stack_layouts(stored) == {LAYOUT_STORED}
    monkeypatch.delenv("LLAMACY_REPACK")
    for threads, n_batch, repack in ((1, 512, "load"), (2, 512, "load"), (2, 7, "load"), (2, 1, "deferred")):
        llm = Llama(str(path), n_threads=threads, n_batch=n_batch, kv_type="f32", repack=repack)
        np.testing.assert_array_equal(llm.logits(ids), want, err_msg=f"threads={threads} n_batch={n_batch}")
        if repack == "deferred":
            pending = llm.weights.deferred
            assert _stack_layouts(llm) == {LAYOUT_STORED}
            if tiles_available():
                assert pending.done and pending.pending  # the evaluations left the stacks to idle time
                pending.finish()
                np.testing.assert_array_equal(llm.logits(ids), want, err_msg="stacks packed in idle time")
        if repack == "deferred" and not tiles_available():
            assert _stack_layouts(llm) == {LAYOUT_STORED}
        elif tiles_available():
            assert {(m.type, m.layout) for layer in llm.weights.layers for m in _stacks(layer)} == {
                (t, tile_layout(t, width, width)) for t in types
            }
        else:
            assert _stack_layouts(llm) == {LAYOUT_STORED}
    assert not experts_repackable(width + 4)  # tiles would straddle two experts


def test_idle_time_packs_the_expert_stacks(tmp_path) -> None:
    """Llama.idle (a chat waiting for its next message) packs what a deferred repacking left, the expert
    stacks included, on a thread; the session's next evaluation reads the tiles and gives the same logits.
    A block left at once leaves the rest for later, with the same results."""
    from llamacy.kernels.matmul import tiles_available
    from llamacy.kernels.repack import LAYOUT_STORED

    from llamacy.engine import Llama

    if not tiles_available():
        pytest.skip("the expert stacks stay stored without the VNNI kernels")
    model = write_hf_moe_model(tmp_path / "m", "qwen3moe", n_embd=64, n_ff_exp=64, clear_routing=True)
    path = tmp_path / "q4_0.gguf"
    convert(model.path, path, "q4_0", threads=2)
    llm = Llama(str(path), n_threads=2, kv_type="f32", repack="deferred")
    first = llm.logits(IDS[:12])
    for _ in range(64):  # evaluations pack the dense matrices, never a stack
        if llm.weights.deferred.done:
            break
        llm.logits(IDS[:3])
    assert llm.weights.deferred.done and _stack_layouts(llm) == {LAYOUT_STORED}
    with llm.idle() as done:
        assert done.wait(60)
    assert not llm.weights.deferred.pending
    assert LAYOUT_STORED not in _stack_layouts(llm)
    np.testing.assert_array_equal(llm.logits(IDS[:12]), first)
    with llm.idle() as done:  # nothing left: the block returns at once
        assert done.is_set()

    # Left at once: whatever the thread packed before it saw the stop, the rest packs later, same logits.
    again = Llama(str(path), n_threads=2, kv_type="f32", repack="deferred")
    with again.idle():
        pass
    again.weights.deferred.finish()
    np.testing.assert_array_equal(again.logits(IDS[:12]), first)


def _stack_layouts(llm) -> set[int]:
    return {m.layout for layer in llm.weights.layers for m in _stacks(layer)}


def _stacks(layer: dict) -> list:
    return [m for k, m in layer.items() if k.endswith("_exps") and m is not None]
