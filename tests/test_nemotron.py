"""Nemotron-4 / Minitron (GGUF architecture "nemotron", Hugging Face NemotronForCausalLM).

Two independent float64 oracles, and the engine held to each:
- tests/reference/hf_numpy.py runs a tiny Hugging Face checkpoint (tests/hf_nemotron.py) in transformers'
  conventions: LayerNorm1P (w + 1) with biases, partial rotate_half RoPE, ReLU² MLP.
- tests/reference/numpy_forward.py runs a GGUF file in llama.cpp's: LayerNorm with the +1 already folded
  in, NEOX RoPE over rope.dimension_count dims, LLM_FFN_RELU_SQR.
test_oracles_agree proves the two agree (through llama.cpp's conversion done by hand) without the engine;
the rest need llamacy to load "nemotron" files and convert NemotronForCausalLM checkpoints.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from llamacy.engine import Llama
from tests.hf_nemotron import llama_cpp_tensors
from tests.model_factory import write_tiny_model
from tests.reference.numpy_forward import reference_logits
from tests.test_convert import HF_BOUNDS, IDS, HFModel, engine_logits, rel_rms, write_hf_model
from tests.test_forward import CLEAR_MARGIN, F16_KV_ATOL, QUANT_REL_ERR

# Released Nemotron/Minitron checkpoints have no attention or MLP biases; the config allows both.
BIASES = {"plain": {}, "biased": {"attention_bias": True, "mlp_bias": True}}
# Engine against the Hugging Face oracle after `llamacy convert --type f32`: float32 arithmetic only.
HF_F32_BOUND = 1e-4


def _ids(n_vocab: int, n: int = 24, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, n_vocab, n).tolist()


def _margin(ref: np.ndarray) -> np.ndarray:
    top2 = np.sort(ref, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def _decode(path: Path, ids: list[int], n_threads: int = 1, kv_type: str = "f32") -> np.ndarray:
    """Logits of each position computed one token at a time through the cache."""
    llm = Llama(path, n_threads=n_threads, n_ctx=64, kv_type=kv_type)
    return np.stack([llm.model.eval([t], logits="last") for t in ids])


def _hf(tmp_path: Path, variant: str, seed: int = 0) -> HFModel:
    return write_hf_model(tmp_path / f"hf-{variant}", "nemotron", seed=seed, **BIASES[variant])


def _factory_twin(model: HFModel, path: Path, tensors: dict[str, np.ndarray] | None = None) -> Path:
    """The F32 GGUF file llama.cpp's converter would write for this checkpoint: its hparams, and its tensors
    with the converter's transforms applied by hand (or `tensors`, named as GGUF names them)."""
    c = model.config
    return write_tiny_model(
        path, "nemotron", wtype=QT.F32, n_vocab=c["vocab_size"], n_embd=c["hidden_size"],
        n_ff=c["intermediate_size"], n_layer=c["num_hidden_layers"], n_head=c["num_attention_heads"],
        n_head_kv=c["num_key_value_heads"], head_dim=c["head_dim"], n_ctx=c["max_position_embeddings"],
        rope_base=c["rope_theta"], norm_eps=c["norm_eps"], partial_rotary_factor=c["partial_rotary_factor"],
        attn_bias=c["attention_bias"], mlp_bias=c["mlp_bias"],
        tensors=llama_cpp_tensors(model.weights) if tensors is None else tensors,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# The oracles, without the engine


@pytest.mark.parametrize("variant", list(BIASES))
def test_oracles_agree(tmp_path, variant: str) -> None:
    """hf_numpy on the checkpoint == numpy_forward on llama.cpp's conversion of it, in float64."""
    model = _hf(tmp_path, variant)
    gguf_path = _factory_twin(model, tmp_path / "twin.gguf")
    hf = model.logits(IDS)
    gguf = reference_logits(gguf_path, IDS, dtype=np.float64)
    assert hf.shape == gguf.shape == (len(IDS), model.config["vocab_size"])
    scale = np.abs(hf).max()
    assert np.abs(gguf - hf).max() <= 1e-9 * scale
    # The model is not degenerate: logits O(1), and the prediction moves with the input.
    assert 0.5 < hf.std() < 10 and len(set(hf.argmax(1).tolist())) > len(IDS) // 3
    # And the comparison can tell: without the converter's +1 fold the file is a different model.
    unfolded = {
        k: v - np.float32(1.0) if k.endswith("norm.weight") else v
        for k, v in llama_cpp_tensors(model.weights).items()
    }
    bad = _factory_twin(model, tmp_path / "unfolded.gguf", unfolded)
    assert np.abs(reference_logits(bad, IDS, dtype=np.float64) - hf).max() > 1e-2 * scale


# ---------------------------------------------------------------------------------------------------------
# `llamacy convert` of a NemotronForCausalLM checkpoint, against the Hugging Face oracle


@pytest.mark.parametrize("variant", list(BIASES))
def test_hf_f32_conversion_matches_hugging_face_forward(tmp_path, variant: str) -> None:
    from llamacy.convert import convert

    model = _hf(tmp_path, variant, seed=1)
    out = tmp_path / "f32.gguf"
    convert(model.path, out, "f32", threads=1)
    want = model.logits(IDS)
    got = engine_logits(out, IDS)  # prefill: all positions in one batch
    assert got.shape == want.shape
    assert rel_rms(got, want) < HF_F32_BOUND, f"prefill: relative RMS error {rel_rms(got, want):.2e}"
    assert (got.argmax(-1) == want.argmax(-1)).all()
    steps = _decode(out, IDS)  # decode: one token at a time
    assert rel_rms(steps, want) < HF_F32_BOUND, f"decode: relative RMS error {rel_rms(steps, want):.2e}"


def test_hf_conversion_layout_is_llama_cpps(tmp_path) -> None:
    """The converted file has llama.cpp's tensors (names, shapes, F32 for 1-D) and the metadata its nemotron
    loader reads, with the values convert_hf_to_gguf.py's NemotronModel would write; the norm weights hold
    w + 1 and nothing else is transformed."""
    from llamacy.convert import convert
    from llamacy.gguf import GGUFFile

    model = _hf(tmp_path, "biased", seed=2)
    out = tmp_path / "f32.gguf"
    convert(model.path, out, "f32", threads=1)
    ours, twin = GGUFFile(out), GGUFFile(_factory_twin(model, tmp_path / "twin.gguf"))
    assert ours.metadata["general.architecture"] == "nemotron"
    assert {n: (tuple(t.shape), t.type) for n, t in ours.tensors.items()} == {
        n: (tuple(t.shape), t.type) for n, t in twin.tensors.items()
    }
    for name, t in twin.tensors.items():  # the twin holds the converter's transforms applied by hand
        assert np.array_equal(ours.tensors[name].data, t.data), name
    read_by_llama_cpp = [
        "context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
        "attention.head_count_kv", "attention.layer_norm_epsilon", "attention.key_length",
        "attention.value_length", "rope.dimension_count", "rope.freq_base", "vocab_size",
    ]  # fmt: skip
    for key in read_by_llama_cpp:
        key = "nemotron." + key
        assert key in ours.metadata, key
        assert np.isclose(ours.metadata[key], twin.metadata[key]), key
    assert ours.metadata["nemotron.rope.dimension_count"] == 8  # int(0.5 * 64) // 4: half of each head
    md = ours.metadata
    assert md["tokenizer.ggml.model"] == "llama"
    assert (md["tokenizer.ggml.bos_token_id"], md["tokenizer.ggml.eos_token_id"]) == (2, 3)
    assert (md["tokenizer.ggml.padding_token_id"], md["tokenizer.ggml.unknown_token_id"]) == (0, 1)
    assert len(md["tokenizer.ggml.tokens"]) == model.config["vocab_size"]


def test_hf_q8_0_conversion(tmp_path) -> None:
    """q8_0: logits close to the oracle, every matrix Q8_0 with exactly the bytes gguf.quants.quantize makes
    of the f32 conversion's values, every 1-D tensor F32 and unchanged."""
    from gguf.quants import quantize

    from llamacy.convert import convert
    from llamacy.gguf import GGUFFile

    model = _hf(tmp_path, "plain", seed=3)
    f32, q8 = tmp_path / "f32.gguf", tmp_path / "q8.gguf"
    convert(model.path, f32, "f32", threads=1)
    convert(model.path, q8, "q8_0", threads=1)
    err = rel_rms(engine_logits(q8, IDS), model.logits(IDS))
    assert err < HF_BOUNDS["q8_0"], f"relative RMS error {err:.3f}"
    a, b = GGUFFile(f32), GGUFFile(q8)
    assert list(a.tensors) == list(b.tensors)
    for name, t in b.tensors.items():
        src = a.tensors[name]
        values = src.data.view(np.float32).reshape(src.shape)
        if values.ndim == 1:
            assert t.type == QT.F32 and np.array_equal(t.data, src.data), name
        else:
            assert t.type == QT.Q8_0, name
            assert np.array_equal(t.data, quantize(values, QT.Q8_0).view(np.uint8).reshape(-1)), name


# ---------------------------------------------------------------------------------------------------------
# llama.cpp-layout files (tests/model_factory.py), against the GGUF oracle


@pytest.mark.parametrize("variant", ["plain", "biased"])
def test_f32_file_matches_oracle_prefill_decode_threads(tmp_path, variant: str) -> None:
    bias = variant == "biased"
    path = write_tiny_model(tmp_path / "m.gguf", "nemotron", wtype=QT.F32, attn_bias=bias, mlp_bias=bias)
    llm = Llama(path, n_threads=1, kv_type="f32")
    ids = _ids(llm.n_vocab)
    ref = reference_logits(path, ids)
    got = llm.logits(ids)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    assert (got.argmax(1) == ref.argmax(1)).all()
    two = Llama(path, n_threads=2, kv_type="f32").logits(ids)
    np.testing.assert_array_equal(two, got)  # the thread team splits work, not arithmetic
    for n_threads in (1, 2):
        np.testing.assert_allclose(_decode(path, ids, n_threads), ref, atol=1e-4, rtol=0)


def test_q8_0_file_matches_oracle_prefill_decode_threads(tmp_path) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", "nemotron", wtype=QT.Q8_0)
    llm = Llama(path, n_threads=1)
    ids = _ids(llm.n_vocab)
    ref = reference_logits(path, ids)
    got = llm.logits(ids)
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    assert rel < QUANT_REL_ERR, f"max error {rel:.3f} of the logit scale"
    same = got.argmax(1) == ref.argmax(1)
    assert same[_margin(ref) > CLEAR_MARGIN].all() and same.mean() >= 0.75  # as test_forward's bounds
    np.testing.assert_array_equal(Llama(path, n_threads=2).logits(ids), got)
    for n_threads in (1, 2):
        steps = _decode(path, ids, n_threads, kv_type="f16")  # the default cache, as `llm` above
        np.testing.assert_allclose(steps, got, atol=1e-4, rtol=1e-5)


def test_half_kv_cache_matches_oracle_with_half_kv(tmp_path) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", "nemotron", wtype=QT.F32)
    llm = Llama(path, n_threads=1, kv_type="f16")
    ids = _ids(llm.n_vocab, 40)
    got = llm.logits(ids)
    err16 = np.abs(got - reference_logits(path, ids, kv_type="f16")).max()
    assert err16 < F16_KV_ATOL
    assert err16 * 2 < np.abs(got - reference_logits(path, ids)).max()


def test_sequences_batched_together_equal_each_alone(tmp_path) -> None:
    """Two sequences decoded in one batch (as the server does) give what each gives alone (the pattern of
    test_forward.py's test of the same name)."""
    from tests.batching import interleaved

    path = write_tiny_model(tmp_path / "m.gguf", "nemotron", wtype=QT.Q8_0, attn_bias=True, mlp_bias=True)
    got_a, got_b, want_a, want_b = interleaved(path, _ids(300, 9, seed=1), _ids(300, 6, seed=2), steps=4)
    np.testing.assert_allclose(got_a, want_a, atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(got_b, want_b, atol=1e-4, rtol=1e-5)
