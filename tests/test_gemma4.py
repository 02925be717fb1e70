"""Gemma 4, dense form (GGUF architecture "gemma4", Hugging Face Gemma4ForConditionalGeneration).

The tiny checkpoint (tests/hf_gemma4.py) has everything the dense models vary per layer: sliding and full
layers with different head sizes and KV head counts, V = K on full layers, proportional RoPE, the last two
layers sharing the K/V of earlier ones with a double-wide MLP, per-layer embeddings, layer scalars and final
soft-capping; a window of 6 positions, so the test ids run well past it. The oracle is a float64 forward pass
written from modeling_gemma4.py; the engine is held to it through `llamacy convert` and through a file
written the way llama.cpp's converter writes one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from llamacy.engine import Llama
from tests.hf_gemma4 import MOE, llama_cpp_tensors, write_gemma4_hf_model, write_llama_cpp_gguf
from tests.test_convert import HF_BOUNDS, rel_rms

BOUND = 1e-4  # engine (float32) against the float64 oracle, relative to the largest logit


def _ids(n_vocab: int, n: int = 24, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, n_vocab, n).tolist()


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def _prefill(path: Path, ids: list[int], n_threads: int = 1, kv_type: str = "f32") -> np.ndarray:
    return Llama(path, n_threads=n_threads, n_ctx=64, kv_type=kv_type).model.eval(ids, logits="all")


def _decode(path: Path, ids: list[int], n_threads: int = 1, kv_type: str = "f32") -> np.ndarray:
    llm = Llama(path, n_threads=n_threads, n_ctx=64, kv_type=kv_type)
    return np.stack([llm.model.eval([t], logits="last") for t in ids])


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_gemma4_hf_model(tmp_path_factory.mktemp("g4") / "hf", seed=1)


def test_llama_cpp_layout_file_matches_hugging_face_forward(model, tmp_path) -> None:
    path = write_llama_cpp_gguf(model, tmp_path / "twin.gguf")
    ids = _ids(model.config["vocab_size"])
    want = model.logits(ids)
    assert np.abs(want).max() > 1.0 and len(set(want.argmax(1))) > 3  # not degenerate
    got = _prefill(path, ids)
    assert _rel(got, want) < BOUND, f"prefill {_rel(got, want):.2e}"
    for n_threads in (1, 2):
        steps = _decode(path, ids, n_threads)
        assert _rel(steps, want) < BOUND, f"decode ({n_threads} threads) {_rel(steps, want):.2e}"
    np.testing.assert_array_equal(_prefill(path, ids, 2), got)  # threads split work, not arithmetic


def test_hf_f32_conversion_matches_hugging_face_forward(model, tmp_path, capfd) -> None:
    from llamacy.convert import convert
    from llamacy.gguf import GGUFFile

    out = tmp_path / "f32.gguf"
    convert(model.path, out, "f32", threads=1)
    assert "vision/audio tower" in capfd.readouterr().err  # skipped, and said so
    ids = _ids(model.config["vocab_size"], seed=2)
    want = model.logits(ids)
    got = _prefill(out, ids)
    assert _rel(got, want) < BOUND, f"prefill {_rel(got, want):.2e}"
    assert _rel(_decode(out, ids), want) < BOUND
    # The same file llama.cpp's converter writes: tensors (names, shapes, types, bytes) and the keys its
    # gemma4 loader reads.
    ours, twin = GGUFFile(out), GGUFFile(write_llama_cpp_gguf(model, tmp_path / "twin.gguf"))
    assert {n: (tuple(t.shape), t.type) for n, t in ours.tensors.items()} == {
        n: (tuple(t.shape), t.type) for n, t in twin.tensors.items()
    }
    for name, t in twin.tensors.items():
        assert np.array_equal(ours.tensors[name].data, t.data), name
    for key, value in twin.metadata.items():
        if key.startswith("gemma4."):
            assert key in ours.metadata, key
            assert np.allclose(np.asarray(ours.metadata[key], float), np.asarray(value, float)), key


def test_hf_q8_0_conversion(model, tmp_path) -> None:
    """q8_0: every matrix Q8_0 with the bytes gguf.quants.quantize makes of the f32 conversion's values, every
    1-D tensor F32 and unchanged; logits close to the oracle."""
    from gguf.quants import quantize

    from llamacy.convert import convert
    from llamacy.gguf import GGUFFile

    f32, q8 = tmp_path / "f32.gguf", tmp_path / "q8.gguf"
    convert(model.path, f32, "f32", threads=1)
    convert(model.path, q8, "q8_0", threads=1)
    a, b = GGUFFile(f32), GGUFFile(q8)
    assert list(a.tensors) == list(b.tensors)
    n_q8 = 0
    for name, t in b.tensors.items():
        src = a.tensors[name]
        values = src.data.view(np.float32).reshape(src.shape)
        if values.ndim == 1:
            assert t.type == QT.F32 and np.array_equal(t.data, src.data), name
        elif t.type == QT.Q8_0:
            n_q8 += 1
            assert np.array_equal(t.data, quantize(values, QT.Q8_0).view(np.uint8).reshape(-1)), name
    assert n_q8 >= 6 * 6  # the layers' matrices at least
    ids = _ids(model.config["vocab_size"], seed=3)
    err = rel_rms(_prefill(q8, ids), model.logits(ids))
    assert err < HF_BOUNDS["q8_0"], f"relative RMS error {err:.3f}"


def test_memory_shared_layers_keep_nothing_and_sliding_layers_their_window(model, tmp_path) -> None:
    from llamacy.gguf import GGUFFile
    from llamacy.model.archs import config_from_metadata
    from llamacy.model.memory import Memory

    path = write_llama_cpp_gguf(model, tmp_path / "twin.gguf")
    cfg = config_from_metadata(GGUFFile(path).metadata, str(path))
    assert [s.kv_from for s in cfg.layers] == [-1, -1, -1, -1, 3, 2]
    assert [s.head_dim for s in cfg.layers] == [16, 16, 32, 16, 16, 32]
    assert [s.n_head_kv for s in cfg.layers] == [2, 2, 1, 2, 2, 1]
    assert [s.n_ff for s in cfg.layers] == [96] * 4 + [192] * 2
    mem = Memory(cfg, n_ctx=64, ubatch=8, kv_type="f32")
    assert [lm.kind for lm in mem.layers] == ["window", "window", "kv", "window", "shared", "shared"]
    assert mem.layers[4].k is mem.layers[3].k and mem.layers[5].v is mem.layers[2].v
    ring = 2 * (6 + 8 - 1)  # window + ubatch - 1 positions, stored twice
    want = 2 * (3 * ring * 2 * 16 * 4 + 64 * 1 * 32 * 4)
    assert mem.nbytes == want == cfg.kv_bytes(64, kv_type="f32", ubatch=8)


def test_sequences_batched_together_equal_each_alone(model, tmp_path) -> None:
    from tests.batching import interleaved

    path = write_llama_cpp_gguf(model, tmp_path / "twin.gguf")
    n_vocab = model.config["vocab_size"]
    got_a, got_b, want_a, want_b = interleaved(
        path, _ids(n_vocab, 12, seed=4), _ids(n_vocab, 9, seed=5), steps=7
    )
    # The numerics contract: a sequence batched with another gives the bits it gives alone.
    np.testing.assert_array_equal(got_a, want_a)
    np.testing.assert_array_equal(got_b, want_b)


def test_every_declared_tensor_is_named_from_the_gguf_table(model, tmp_path) -> None:
    from gguf import TENSOR_NAMES

    from llamacy.gguf import GGUFFile
    from llamacy.model.archs import ARCHITECTURES, config_from_metadata

    path = write_llama_cpp_gguf(model, tmp_path / "twin.gguf")
    cfg = config_from_metadata(GGUFFile(path).metadata, str(path))
    arch = ARCHITECTURES["gemma4"]
    specs = arch.model_tensors(cfg) + [s for il in range(cfg.n_layer) for s in arch.layer_tensors(cfg, il)]
    for spec in specs:
        assert spec.tensor in arch.gguf_tensors, spec
        assert spec.name.rsplit(".", 1)[0] in {
            TENSOR_NAMES[spec.tensor].format(bid=il) for il in range(cfg.n_layer)
        }


# ---------------------------------------------------------------------------------------------------------
# The mixture-of-experts form (26B-A4B): a dense FFN plus the experts in every layer


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    return write_gemma4_hf_model(tmp_path_factory.mktemp("g4moe") / "hf", seed=7, **MOE)


def _split_experts(tensors: dict[str, np.ndarray], fe: int) -> dict[str, np.ndarray]:
    """The separate form: ffn_gate_exps and ffn_up_exps instead of ffn_gate_up_exps."""
    out = {}
    for name, value in tensors.items():
        if name.endswith("ffn_gate_up_exps.weight"):
            out[name.replace("gate_up_exps", "gate_exps")] = value[:, :fe]
            out[name.replace("gate_up_exps", "up_exps")] = value[:, fe:]
        else:
            out[name] = value
    return out


def test_moe_files_match_hugging_face_forward(moe_model, tmp_path) -> None:
    c = moe_model.config
    ids = _ids(c["vocab_size"], seed=8)
    want = moe_model.logits(ids)
    fused = write_llama_cpp_gguf(moe_model, tmp_path / "fused.gguf")
    split = write_llama_cpp_gguf(
        moe_model,
        tmp_path / "split.gguf",
        tensors=_split_experts(llama_cpp_tensors(c, moe_model.weights), c["moe_intermediate_size"]),
    )
    got = _prefill(fused, ids)
    assert _rel(got, want) < BOUND, f"prefill {_rel(got, want):.2e}"
    assert _rel(_decode(fused, ids), want) < BOUND
    assert _rel(_decode(fused, ids, 2), want) < BOUND
    np.testing.assert_array_equal(_prefill(split, ids), got)  # the same rows, the same arithmetic


def test_moe_hf_conversion(moe_model, tmp_path) -> None:
    from gguf.quants import quantize

    from llamacy.convert import convert
    from llamacy.gguf import GGUFFile

    f32, q8 = tmp_path / "f32.gguf", tmp_path / "q8.gguf"
    convert(moe_model.path, f32, "f32", threads=1)
    convert(moe_model.path, q8, "q8_0", threads=1)
    ids = _ids(moe_model.config["vocab_size"], seed=9)
    want = moe_model.logits(ids)
    assert _rel(_prefill(f32, ids), want) < BOUND
    assert _rel(_decode(f32, ids), want) < BOUND
    ours, twin = GGUFFile(f32), GGUFFile(write_llama_cpp_gguf(moe_model, tmp_path / "twin.gguf"))
    assert {n: (tuple(t.shape), t.type) for n, t in ours.tensors.items()} == {
        n: (tuple(t.shape), t.type) for n, t in twin.tensors.items()
    }
    for name, t in twin.tensors.items():
        assert np.array_equal(ours.tensors[name].data, t.data), name
    a, b = GGUFFile(f32), GGUFFile(q8)
    for name, t in b.tensors.items():
        if t.type == QT.Q8_0:
            src = a.tensors[name]
            values = src.data.view(np.float32).reshape(-1, src.shape[-1])
            assert np.array_equal(t.data.reshape(-1), quantize(values, QT.Q8_0).view(np.uint8).reshape(-1)), (
                name
            )
    assert b.tensors["blk.0.ffn_gate_up_exps.weight"].type == QT.Q8_0
    # Looser than the dense bound (HF_BOUNDS): quantizing a 64-wide router moves some tokens to other
    # experts (0.088 measured on this checkpoint); the bytes above are what pins q8_0 down.
    err = rel_rms(_prefill(q8, ids), want)
    assert err < 0.15, f"relative RMS error {err:.3f}"


def test_prefix_reuse_and_speculation_on_rings_and_shared_layers(model, tmp_path) -> None:
    """What serving relies on, on gemma4's memory (sliding rings, shared layers): a continued prompt
    evaluates only its new tokens and matches a fresh run bit for bit, and speculative decoding gives the
    greedy output of plain decoding."""
    path = write_llama_cpp_gguf(model, tmp_path / "twin.gguf")
    n_vocab = model.config["vocab_size"]
    first, more = _ids(n_vocab, 20, seed=6), _ids(n_vocab, 6, seed=7)
    llm = Llama(path, n_threads=1, n_ctx=64, n_batch=4)  # micro-batches of 4: rings of window + 3
    assert any(lm.ring for lm in llm.session.model.memory.layers)

    def greedy(target: Llama, ids: list[int], **kw) -> list[int]:
        return [t for t, _ in target.generate_tokens(ids, max_tokens=12, temperature=0, **kw) if t >= 0]

    out = greedy(llm, first)
    cont = first + out + more
    again = greedy(llm, cont)
    assert llm.last.stats.prompt_evaluated == len(more) + 1  # the cached turn, less its last token
    fresh = Llama(path, n_threads=1, n_ctx=64, n_batch=4)
    assert greedy(fresh, cont) == again
    fast = Llama(path, n_threads=1, n_ctx=64, n_batch=4)
    assert greedy(fast, cont, speculate="ngram", draft_max=3) == again
    looped = first[:10] * 3  # a prompt whose continuation prompt lookup can draft
    want = greedy(fresh, looped)
    assert greedy(fast, looped, speculate="ngram", draft_max=3) == want
    assert fast.last.stats.draft_accepted > 0
