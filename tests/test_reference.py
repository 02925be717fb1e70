"""The oracles themselves: the numpy forward pass on real models (does it predict what llama.cpp does?),
on tiny random models of every architecture, its causality and sliding window, and the tiny-model factory
(K-quant packers, vocabularies)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from tests.model_factory import (
    BPE_CONTROL,
    DEFAULTS,
    WEIGHT_TYPES,
    bytes_to_unicode,
    quantize,
    write_tiny_model,
)
from tests.reference.numpy_forward import load, reference_logits, rope

ARCHS = tuple(DEFAULTS)
LEGACY_TYPES = [t for t in WEIGHT_TYPES if t not in (QT.Q4_K, QT.Q5_K, QT.Q6_K)]
K_TYPES = [QT.Q4_K, QT.Q5_K, QT.Q6_K]
# Row lengths that K-quant blocks (256 values) fill.
K_DIMS = {"n_embd": 256, "n_ff": 512, "head_dim": 64}

PROMPT_SMOLLM2 = [504, 3575, 282, 4649, 314]  # "The capital of France is"
PROMPT_GEMMA3 = [818, 5279, 529, 7001, 563]  # "The capital of France is" (no <bos>)


def _top(path, row: np.ndarray, k: int = 5) -> list[tuple[int, str, float]]:
    tokens = load(path).tokens()
    return [(int(i), tokens[i], round(float(row[i]), 2)) for i in np.argsort(-row)[:k]]


# -- real models ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.model
def test_smollm2_predicts_paris(default_model_path) -> None:
    """llama.cpp's greedy continuation of this prompt begins " Paris."; the oracle must agree."""
    logits = reference_logits(default_model_path, PROMPT_SMOLLM2)
    assert logits.shape == (5, 49152) and np.isfinite(logits).all()
    paris = load(default_model_path).tokens().index("ĠParis")
    print("SmolLM2 top-5 after 'The capital of France is':", _top(default_model_path, logits[-1]))
    assert int(np.argmax(logits[-1])) == paris


@pytest.mark.slow
@pytest.mark.model
def test_gemma3_next_token_is_sensible(gemma_model_path) -> None:
    """Gemma 3 270M (the base model) on the same prompt. Its greedy next token is " France" (20.1), with
    " of" (19.1) and " Paris" (19.1) next; with <bos> first it is " the" (greedy: " the capital of the
    country of France. It is the largest"), " Paris" third. We check " Paris" is among the top five."""
    logits = reference_logits(gemma_model_path, PROMPT_GEMMA3)
    assert logits.shape == (5, 262144) and np.isfinite(logits).all()
    top = _top(gemma_model_path, logits[-1])
    print("Gemma 3 top-5 after 'The capital of France is':", top)
    assert "▁Paris" in [t for _, t, _ in top]
    # Every position predicts a plausible piece of English, not noise: the first is "The" → " of" etc.
    assert load(gemma_model_path).tokens()[int(np.argmax(logits[2]))] in ("▁the", "▁France")


# -- tiny models ---------------------------------------------------------------------------------------


def _ids(n: int, seed: int = 0, vocab: int = 300) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]


def _check_logits(path, n: int = 24) -> np.ndarray:
    ids = _ids(n)
    logits = reference_logits(path, ids)
    n_vocab = load(path).config.n_vocab
    assert logits.shape == (n, n_vocab) and logits.dtype == np.float32
    assert np.isfinite(logits).all()
    assert 0.5 < float(logits.std()) < 5.0  # O(1), as the factory promises
    argmax = logits.argmax(axis=1)
    assert len(set(argmax.tolist())) >= n // 3  # the prediction depends on the input
    assert np.mean(argmax == np.array(ids)) < 0.5  # and is not just the input token echoed back
    return logits


@pytest.mark.parametrize("wtype", LEGACY_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.slow
def test_tiny_models_load_and_give_finite_logits(tiny_model, arch: str, wtype: QT) -> None:
    _check_logits(tiny_model(arch, wtype))


@pytest.mark.parametrize("wtype", K_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.slow
def test_tiny_models_in_k_quants(tiny_model, arch: str, wtype: QT) -> None:
    path = tiny_model(arch, wtype, **K_DIMS, n_layer=2)
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}
    assert types["blk.0.ffn_down.weight"] == wtype and types["token_embd.weight"] == wtype
    _check_logits(path)


def test_quantized_model_is_close_to_its_float_twin(tmp_path) -> None:
    """Same seed, same weights before quantization: Q8_0 logits stay near F32 ones (the factory really
    quantizes the float weights it would otherwise write)."""
    ids = _ids(16)
    f32 = reference_logits(write_tiny_model(tmp_path / "f.gguf", "qwen3", QT.F32, seed=3), ids)
    q8 = reference_logits(write_tiny_model(tmp_path / "q.gguf", "qwen3", QT.Q8_0, seed=3), ids)
    assert np.abs(q8 - f32).max() < 0.1 * np.abs(f32).max()
    assert np.mean(q8.argmax(1) == f32.argmax(1)) > 0.8


EXPECTED_LAYER_TENSORS = {
    "llama": {
        "attn_norm",
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_norm",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    },
}
EXPECTED_LAYER_TENSORS["qwen2"] = EXPECTED_LAYER_TENSORS["llama"] | {
    "attn_q.bias",
    "attn_k.bias",
    "attn_v.bias",
}
EXPECTED_LAYER_TENSORS["qwen3"] = EXPECTED_LAYER_TENSORS["llama"] | {"attn_q_norm", "attn_k_norm"}
EXPECTED_LAYER_TENSORS["gemma3"] = EXPECTED_LAYER_TENSORS["qwen3"] | {"post_attention_norm", "post_ffw_norm"}
# llama.cpp's nemotron (src/models/nemotron.cpp): LayerNorms with biases, no gate.
EXPECTED_LAYER_TENSORS["nemotron"] = (EXPECTED_LAYER_TENSORS["llama"] - {"ffn_gate"}) | {
    "attn_norm.bias",
    "ffn_norm.bias",
}


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_layout(tiny_model, arch: str) -> None:
    """Tensor names, GGUF shapes (ne[0] = input dim) and types as llama.cpp expects them."""
    path = tiny_model(arch, QT.Q8_0)
    r = gguf.GGUFReader(path)
    hp = DEFAULTS[arch]
    tensors = {t.name: t for t in r.tensors}
    layer0 = {n.removeprefix("blk.0.").removesuffix(".weight") for n in tensors if n.startswith("blk.0.")}
    assert layer0 == EXPECTED_LAYER_TENSORS[arch]
    assert ("output.weight" in tensors) == (not hp["tie_embeddings"])
    q_dim = hp["n_head"] * hp["head_dim"]
    assert list(tensors["blk.0.attn_q.weight"].shape) == [hp["n_embd"], q_dim]
    assert list(tensors["blk.0.attn_output.weight"].shape) == [q_dim, hp["n_embd"]]
    assert list(tensors["blk.0.ffn_down.weight"].shape) == [hp["n_ff"], hp["n_embd"]]
    assert tensors["blk.0.attn_norm.weight"].tensor_type == QT.F32
    assert tensors["token_embd.weight"].tensor_type == QT.Q8_0
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    assert meta["general.architecture"] == arch
    assert meta[f"{arch}.attention.head_count_kv"] == hp["n_head_kv"] < hp["n_head"]
    assert meta[f"{arch}.block_count"] == hp["n_layer"]
    if arch in ("qwen3", "gemma3"):
        assert meta[f"{arch}.attention.key_length"] == hp["head_dim"] != hp["n_embd"] // hp["n_head"]
    if arch == "gemma3":
        assert meta["gemma3.attention.sliding_window"] == hp["sliding_window"]
    if arch == "nemotron":  # the eps llama.cpp reads, and half of each head rotated
        assert np.isclose(meta["nemotron.attention.layer_norm_epsilon"], hp["norm_eps"])
        assert meta["nemotron.rope.dimension_count"] == hp["head_dim"] // 2
        assert tensors["output_norm.bias"].tensor_type == QT.F32


def test_tied_and_untied_heads(tiny_model) -> None:
    untied = tiny_model("llama", QT.F32, tie_embeddings=False)
    tied = tiny_model("llama", QT.F32, tie_embeddings=True)
    assert not load(untied).config.tied and load(tied).config.tied
    _check_logits(tied)


def test_factory_rejects_bad_requests(tmp_path) -> None:
    with pytest.raises(ValueError, match="architecture"):
        write_tiny_model(tmp_path / "x.gguf", "mamba")
    with pytest.raises(TypeError, match="unknown hyper-parameters"):
        write_tiny_model(tmp_path / "x.gguf", "llama", n_expert=8)
    with pytest.raises(ValueError, match="blocks of 256"):
        write_tiny_model(tmp_path / "x.gguf", "llama", QT.Q4_K)  # 64-wide rows cannot hold K-quants


# -- properties of the forward pass --------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_causality(tiny_model, arch: str) -> None:
    """Logits at position i depend on tokens 0..i only: changing the tail leaves the head untouched, and a
    prefix evaluated alone gives the same logits as inside the longer sequence."""
    path = tiny_model(arch, QT.Q8_0)
    a = _ids(20, seed=1)
    b = a[:12] + _ids(8, seed=2)
    la, lb = reference_logits(path, a), reference_logits(path, b)
    np.testing.assert_allclose(la[:12], lb[:12], rtol=0, atol=1e-5)
    assert np.abs(la[12:] - lb[12:]).max() > 1e-2  # the tail did change: the check above can fail
    np.testing.assert_allclose(reference_logits(path, a[:7]), la[:7], rtol=0, atol=1e-5)


@pytest.mark.parametrize(("n_layer", "first_unaffected"), [(5, 16), (6, None)])
def test_gemma3_sliding_window_reach(tiny_model, n_layer: int, first_unaffected: int | None) -> None:
    """With a window of 4, a local layer at position p sees p-3..p, so token 0 reaches position 3·L after L
    local layers and no further: 5 local layers → positions 1..15 change, 16+ do not. A 6th layer is
    global (every 6th), which lets token 0 reach every position."""
    path = tiny_model("gemma3", QT.F32, n_layer=n_layer, sliding_window=4)
    a = _ids(22, seed=4)
    b = [(a[0] + 1) % 300, *a[1:]]
    diff = np.abs(reference_logits(path, a) - reference_logits(path, b)).max(axis=1)
    if first_unaffected is None:
        assert (diff[1:] > 1e-6).all()
    else:
        assert (diff[1:first_unaffected] > 1e-6).all()
        assert (diff[first_unaffected:] == 0).all()


def test_rope_pairs_and_angles() -> None:
    """Normal mode rotates (x0, x1), (x2, x3), ...; NEOX rotates (x0, x2), (x1, x3) for head_dim 4; angles
    θ_i = pos · base^(-2i/n_rot); dims past n_rot untouched; position 0 is the identity."""
    x = np.arange(1.0, 7.0).reshape(1, 1, 6)  # one token, one head, head_dim 6
    pos = np.array([3])
    base, n_rot = 100.0, 4
    t0, t1 = 3 * base**0.0, 3 * base ** (-2 / 4)
    c0, s0, c1, s1 = np.cos(t0), np.sin(t0), np.cos(t1), np.sin(t1)
    normal = rope(x, pos, n_rot, base, 1.0, "normal")[0, 0]
    expected = [1 * c0 - 2 * s0, 1 * s0 + 2 * c0, 3 * c1 - 4 * s1, 3 * s1 + 4 * c1, 5, 6]
    np.testing.assert_allclose(normal, expected)
    neox = rope(x, pos, n_rot, base, 1.0, "neox")[0, 0]
    expected = [1 * c0 - 3 * s0, 2 * c1 - 4 * s1, 1 * s0 + 3 * c0, 2 * s1 + 4 * c1, 5, 6]
    np.testing.assert_allclose(neox, expected)
    np.testing.assert_allclose(rope(x, np.array([0]), n_rot, base, 1.0, "neox"), x)
    # linear scaling: position 3 at freq_scale 0.5 is position 1.5
    np.testing.assert_allclose(
        rope(x, pos, n_rot, base, 0.5, "normal"), rope(x, np.array([1.5]), n_rot, base, 1.0, "normal")
    )


# -- the factory's own parts ---------------------------------------------------------------------------


@pytest.mark.parametrize(("wtype", "max_rel_err"), [(QT.Q4_K, 0.08), (QT.Q5_K, 0.04), (QT.Q6_K, 0.02)])
def test_k_quant_packers_decode_with_gguf(wtype: QT, max_rel_err: float) -> None:
    """Our K-quant packers against gguf's dequantizer: a wrong bit layout gives errors of order 100%."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((6, 512)) * rng.uniform(0.1, 3.0, (6, 1))).astype(np.float32)
    x[0, :256] = 0.0  # an all-zero block
    x[1, :256] = np.abs(x[1, :256])  # all positive
    x[2, 256:] = -np.abs(x[2, 256:])  # all negative
    q = quantize(x, wtype)
    assert q.dtype == np.uint8 and q.shape == (6, 2 * gguf.GGML_QUANT_SIZES[wtype][1])
    y = gguf.quants.dequantize(q, wtype)
    assert np.array_equal(y[0, :256], np.zeros(256))
    rel = np.abs(y - x).max(axis=1) / np.abs(x).max(axis=1)
    assert (rel < max_rel_err).all(), rel


def test_bpe_vocabulary_is_usable_by_tokenizers(tiny_model) -> None:
    """The tiny byte-level BPE vocabulary builds a `tokenizers` BPE that spells the test prompt in the
    merged tokens, and lays out bytes, merges and control tokens as documented."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    r = gguf.GGUFReader(tiny_model("qwen2", QT.Q8_0))
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    b2u = bytes_to_unicode()
    assert tokens[:256] == [b2u[b] for b in range(256)]
    assert tokens[-3:] == BPE_CONTROL and types[-3:] == [3, 3, 3] and set(types[:-3]) == {1}
    for m in merges:
        left, right = m.split(" ")
        assert left in tokens and right in tokens and left + right in tokens
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, [tuple(m.split(" ")) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    enc = tok.encode("The capital of France is Paris")
    assert enc.tokens == ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis", "ĠParis"]
    assert tok.decode(tok.encode("héllo\n\n  wörld").ids) == "héllo\n\n  wörld"  # bytes round-trip


def test_spm_vocabulary_layout(tiny_model) -> None:
    r = gguf.GGUFReader(tiny_model("gemma3", QT.Q8_0))
    f = {k: r.fields[k].contents() for k in r.fields if k.startswith("tokenizer.ggml.")}
    tokens, types, scores = (
        f["tokenizer.ggml.tokens"],
        f["tokenizer.ggml.token_type"],
        f["tokenizer.ggml.scores"],
    )
    assert f["tokenizer.ggml.model"] == "llama"
    assert tokens[:6] == ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    assert (f["tokenizer.ggml.bos_token_id"], f["tokenizer.ggml.eos_token_id"]) == (2, 1)
    assert tokens[6:262] == [f"<0x{b:02X}>" for b in range(256)] and set(types[6:262]) == {6}
    assert types[3] == 2 and f["tokenizer.ggml.add_bos_token"] is True
    assert len(scores) == len(tokens)
    for piece in ("▁the", "▁capital", "▁France", "▁Paris", "The", "▁is", "▁of"):
        assert piece in tokens
