"""Qwen3-Next (GGUF "qwen3next") and Qwen3.5 (GGUF "qwen35"): gated delta-net + gated attention hybrids.

The oracle is tests/hf_qwen3next.py: a float64 forward pass written from Hugging Face's modeling code, run
on tiny random checkpoints (6 layers, attention every third, GQA, key heads repeated to twice as many value
heads; Qwen3-Next with a mixture and a shared expert, Qwen3.5 dense). The engine runs the GGUF file that
llama.cpp's converter writes for the checkpoint (its transforms by hand: norms + 1, A = -exp(A_log), the
q/k/v/z regrouping, Qwen3.5's value heads reordered to tiled order, the MTP block after the last layer),
and the file `llamacy convert` writes from it. The delta-net runs the same recurrent update for prompts
and decode: every way of batching the same tokens gives bit-identical logits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llamacy.engine import Llama
from llamacy.errors import UnsupportedModelError
from llamacy.gguf import GGUFFile
from llamacy.model import Model
from tests.batching import interleaved
from tests.hf_qwen3next import (
    hf_config,
    hf_hidden,
    hf_logits,
    hf_mtp_hidden,
    hf_mtp_logits,
    random_weights,
    write_llama_cpp_gguf,
)

KINDS = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
F32_BOUND = 1e-4  # relative to the largest logit: float32 arithmetic against float64
IDS = np.random.default_rng(7).integers(0, 300, 24).tolist()


def _rel(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(a - ref).max() / np.abs(ref).max())


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, tuple[dict, dict, Path]]:
    """Per kind: (config, checkpoint tensors, llama.cpp-style F32 GGUF with an MTP block)."""
    out = {}
    for kind in KINDS:
        c = hf_config(kind)
        w = random_weights(c, seed=3, mtp=True)
        path = write_llama_cpp_gguf(tmp_path_factory.mktemp(kind) / "model.gguf", c, w)
        out[kind] = (c, w, path)
    return out


def _model(path: Path, threads: int = 1, n_seq: int = 1) -> Model:
    return Model(GGUFFile(path), n_ctx=64, n_threads=threads, n_seq=n_seq, kv_type="f32")


@pytest.mark.parametrize("kind", KINDS)
def test_llama_cpp_file_matches_hugging_face(files, kind: str) -> None:
    """Prefill and token-by-token decode of the converter's file (MTP block loaded, not run) against the
    float64 Hugging Face forward pass; decode equals prefill bit for bit."""
    c, w, path = files[kind]
    ref = hf_logits(c, w, IDS)
    m = _model(path)
    assert m.cfg.n_layer == 6 and m.cfg.n_nextn == 1
    from llamacy.cli.info import _layer_mix, describe

    assert _layer_mix(describe(str(path), None)).endswith(
        "; 1 multi-token-prediction block in the file, drafts with --speculate mtp"
    )
    assert m.cfg.layer_mixer == ["deltanet", "deltanet", "attention"] * 2
    prefill = m.eval(IDS, logits="all")
    assert _rel(prefill, ref) <= F32_BOUND
    m.kv.clear(0)
    decode = np.stack([m.eval([t]) for t in IDS])
    assert np.array_equal(decode, prefill)
    # Not degenerate: the prediction moves with the input.
    assert len({int(np.argmax(r)) for r in ref}) > 3


def test_legacy_ssm_in(files, tmp_path) -> None:
    """Older qwen3next files fuse q, k, v, z into one ssm_in in Hugging Face's per-key-head order."""
    c, w, _ = files["qwen3_next"]
    path = write_llama_cpp_gguf(tmp_path / "legacy.gguf", c, w, legacy=True)
    assert _rel(_model(path).eval(IDS, logits="all"), hf_logits(c, w, IDS)) <= F32_BOUND


@pytest.mark.parametrize("kind", KINDS)
def test_threads_and_chunks_bit_identical(files, kind: str) -> None:
    path = files[kind][2]
    whole = _model(path).eval(IDS, logits="all")
    assert np.array_equal(_model(path, threads=2).eval(IDS, logits="all"), whole)
    m = _model(path)
    parts = [m.eval(IDS[a:b], logits="all") for a, b in ((0, 5), (5, 12), (12, len(IDS)))]
    assert np.array_equal(np.concatenate(parts), whole)


@pytest.mark.parametrize("kind", KINDS)
def test_batched_equals_solo(files, kind: str) -> None:
    a, b = IDS[:14], IDS[6:20]
    ba, bb, sa, sb = interleaved(files[kind][2], a, b, steps=11)
    assert np.array_equal(ba, sa) and np.array_equal(bb, sb)


@pytest.mark.parametrize("kind", KINDS)
def test_rollback_restores_the_state(files, kind: str) -> None:
    """After a multi-token run, going back up to the snapshots' reach and evaluating the same tokens again
    gives the same logits, bit for bit (a rejected speculative draft)."""
    m = _model(files[kind][2])
    m.eval(IDS[:8], logits="all")
    first = m.eval(IDS[8:14], logits="all")
    for back in (1, 3):
        m.kv.truncate(0, 14 - back)
        again = m.eval(IDS[14 - back : 14], logits="all")
        assert np.array_equal(again, first[6 - back :])


def test_bad_files_are_refused_in_one_line(files, tmp_path) -> None:
    c, w, _ = files["qwen3_5"]

    def rewrite(path: Path, drop: str = "", reshape: str = "") -> Path:
        from tests.hf_qwen3next import llama_cpp_tensors

        tensors = llama_cpp_tensors(c, w)
        if drop:
            del tensors[drop]
        if reshape:
            tensors[reshape] = tensors[reshape][:, :-1].copy()
        write_llama_cpp_gguf(path, c, w, tensors=tensors)
        return path

    for path, what in (
        (rewrite(tmp_path / "missing.gguf", drop="blk.1.ssm_a"), "blk.1.ssm_a"),
        (rewrite(tmp_path / "conv.gguf", reshape="blk.0.ssm_conv1d.weight"), "blk.0.ssm_conv1d.weight"),
    ):
        with pytest.raises(UnsupportedModelError) as e:
            Llama(path, n_ctx=32)
        assert what in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kind", KINDS)
def test_mtp_oracle_checks_itself(files, kind: str) -> None:
    """hf_mtp_logits, the MTP block's float64 forward pass, on what a slip in it would change: its rows are
    hf_mtp_hidden's through the head and start from hf_hidden's rows (whose head gives hf_logits); fc's
    two halves are not interchangeable; row j reads ids[: j + 2] and hidden rows 0..j only."""
    c, w, _ = files[kind]
    ids, E, n = IDS[:12], c["hidden_size"], len(IDS[:12]) - 1
    head = w["lm_head.weight"].astype(np.float64).T
    hidden = hf_hidden(c, w, ids)
    assert np.array_equal(hidden @ head, hf_logits(c, w, ids))
    ref = hf_mtp_logits(c, w, ids)
    assert ref.shape == (n, c["vocab_size"])
    assert np.array_equal(ref, hf_mtp_hidden(c, w, ids) @ head)
    assert np.array_equal(ref, hf_mtp_logits(c, w, ids, hidden=hidden))
    assert len({int(np.argmax(r)) for r in ref}) > 3  # not degenerate
    fc = w["mtp.fc.weight"]
    swapped = {**w, "mtp.fc.weight": np.concatenate([fc[:, E:], fc[:, :E]], axis=1)}
    assert _rel(hf_mtp_logits(c, swapped, ids), ref) > 0.05
    # Causal: another last token, or another last hidden row read, moves the last row only.
    for other in (
        hf_mtp_logits(c, w, [*ids[:-1], (ids[-1] + 1) % 300]),
        hf_mtp_logits(c, w, ids, hidden=np.concatenate([hidden[: n - 1], -hidden[n - 1 :]])),
    ):
        np.testing.assert_allclose(other[:-1], ref[:-1], rtol=0, atol=1e-12 * np.abs(ref).max())
        assert _rel(other[-1], ref[-1]) > 0.05


# ---------------------------------------------------------------------------------------------------------
# Conversion from Hugging Face checkpoints (`llamacy convert`)


def _gguf_tensors(path: Path) -> dict[str, tuple[int, np.ndarray]]:
    import gguf

    return {t.name: (int(t.tensor_type), np.array(t.data)) for t in gguf.GGUFReader(str(path)).tensors}


def _arch(kind: str) -> str:
    return {"qwen3_next": "qwen3next", "qwen3_5": "qwen35", "qwen3_5_moe": "qwen35moe"}[kind]


def _blocks(path: Path, kind: str) -> tuple[int, int | None]:
    """(block_count, nextn_predict_layers) of a file."""
    md = GGUFFile(path).metadata
    return md[f"{_arch(kind)}.block_count"], md.get(f"{_arch(kind)}.nextn_predict_layers")


@pytest.mark.parametrize("kind", KINDS)
def test_hf_conversion_f32(files, tmp_path, kind: str) -> None:
    """`llamacy convert --type f32` writes the tensors llama.cpp's converter writes, the MTP block included
    (mtp.layers.0 as blk.6, its fc and norms as blk.6.nextn.*), and the result matches the Hugging Face
    forward pass."""
    from llamacy.convert import convert
    from tests.hf_qwen3next import llama_cpp_tensors, write_hf

    c, w, _ = files[kind]
    out = tmp_path / "f32.gguf"
    convert(write_hf(tmp_path / "hf", c, w), out, "f32", threads=1)
    ours = _gguf_tensors(out)
    theirs = llama_cpp_tensors(c, w)
    assert set(ours) == set(theirs)
    assert {"blk.6.attn_q.weight", "blk.6.nextn.eh_proj.weight", "blk.6.nextn.enorm.weight"} <= set(ours)
    for name, (_, data) in ours.items():
        assert np.array_equal(data.reshape(theirs[name].shape), theirs[name]), name
    assert _blocks(out, kind) == (7, 1)
    m = _model(out)
    assert m.cfg.n_layer == 6 and m.cfg.n_nextn == 1
    assert _rel(m.eval(IDS, logits="all"), hf_logits(c, w, IDS)) <= F32_BOUND


@pytest.mark.parametrize(("kind", "over"), [("qwen3_next", {}), ("qwen3_5", {"mtp_num_hidden_layers": 1})])
def test_hf_conversion_without_mtp(tmp_path, kind: str, over: dict) -> None:
    """A checkpoint without mtp.* tensors converts to a file without an MTP block, also where config.json
    says mtp_num_hidden_layers (transformers drops the block when it saves a model)."""
    from llamacy.convert import convert
    from tests.hf_qwen3next import llama_cpp_tensors, write_hf

    c = hf_config(kind, **over)
    w = random_weights(c, seed=5)
    out = tmp_path / "f32.gguf"
    convert(write_hf(tmp_path / "hf", c, w), out, "f32", threads=1)
    assert set(_gguf_tensors(out)) == set(llama_cpp_tensors(c, w))
    assert not any(n.startswith("blk.6.") for n in _gguf_tensors(out))
    assert _blocks(out, kind) == (6, None)
    m = _model(out)
    assert m.cfg.n_layer == 6 and m.cfg.n_nextn == 0
    assert _rel(m.eval(IDS, logits="all"), hf_logits(c, w, IDS)) <= F32_BOUND


def test_hf_conversion_refuses_an_incomplete_mtp_block(files, tmp_path) -> None:
    """config.json's mtp_num_hidden_layers counts MTP layers that must all be there; the message names the
    missing tensor."""
    from llamacy.convert import convert
    from llamacy.errors import UsageError
    from tests.hf_qwen3next import write_hf

    c, w, _ = files["qwen3_5"]
    with pytest.raises(UsageError, match=r"lacks .*multi-token-prediction block 1"):
        convert(write_hf(tmp_path / "hf", {**c, "mtp_num_hidden_layers": 2}, w), tmp_path / "o.gguf", "f32")
    assert not (tmp_path / "o.gguf").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_hf_conversion_q8_0(files, tmp_path, kind: str) -> None:
    """q8_0: every quantized tensor byte-identical to the reference quantizer's Q8_0 of llama.cpp's F32
    tensor; what llama-quantize keeps F32 (norms, ssm_a, ssm_dt, ssm_conv1d, routers) stays F32."""
    from gguf import GGMLQuantizationType as QT
    from gguf.quants import quantize

    from llamacy.convert import convert
    from tests.hf_qwen3next import llama_cpp_tensors, write_hf

    c, w, _ = files[kind]
    out = tmp_path / "q8.gguf"
    convert(write_hf(tmp_path / "hf", c, w), out, "q8_0", threads=1)
    theirs = llama_cpp_tensors(c, w)
    kept = ("norm.weight", "ssm_a", "ssm_dt.bias", "ssm_conv1d.weight", "ffn_gate_inp.weight",
            "ffn_gate_inp_shexp.weight")  # fmt: skip
    ours = _gguf_tensors(out)
    assert set(ours) == set(theirs)  # the MTP block's tensors among them
    assert ours["blk.6.nextn.eh_proj.weight"][0] == QT.Q8_0
    assert all(ours[f"blk.6.nextn.{n}.weight"][0] == QT.F32 for n in ("enorm", "hnorm", "shared_head_norm"))
    n_q8 = 0
    for name, (ty, data) in ours.items():
        ref = theirs[name]
        if name.endswith(kept):
            assert ty == QT.F32, name
            assert np.array_equal(data.reshape(ref.shape), ref), name
        else:
            assert ty == QT.Q8_0, name
            assert data.tobytes() == quantize(ref, QT.Q8_0).tobytes(), name
            n_q8 += 1
    assert n_q8 > 10
    # A sanity bound only (the byte checks above are the test): these tiny random models are sensitive to
    # rounding, the float64 oracle itself moves 4% (dense) to 11% (mixture: expert choices flip) in
    # relative RMS when given the Q8_0-rounded weights; the engine measured 6% (qwen35), 10% (qwen3next)
    # and 21% (qwen35moe), the error concentrated at the positions where a token's experts change.
    got, ref = _model(out).eval(IDS, logits="all"), hf_logits(c, w, IDS)
    assert np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref**2)) < 0.3


def test_hf_conversion_of_the_image_text_checkpoint(files, tmp_path) -> None:
    """The released Qwen3.5 checkpoints are Qwen3_5ForConditionalGeneration: text settings under
    text_config, text tensors under model.language_model.*, the MTP block at the top (mtp.*, as vLLM's
    Qwen3_5MTP loads it), a vision tower beside them. The conversion is the text model's with its MTP
    block, tensor for tensor, the tower left out; so is that of a checkpoint keeping the block under
    model.mtp.*."""
    from llamacy.convert import convert
    from tests.hf_qwen3next import write_hf

    c, w, _ = files["qwen3_5"]
    convert(write_hf(tmp_path / "text", c, w), tmp_path / "text.gguf", "f32", threads=1)
    under_model = {("model." + k if k.startswith("mtp.") else k): v for k, v in w.items()}
    convert(write_hf(tmp_path / "under", c, under_model), tmp_path / "under.gguf", "f32", threads=1)
    outer = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
             "text_config": {k: v for k, v in c.items() if k != "architectures"},
             "vision_config": {"depth": 1}, "tie_word_embeddings": c["tie_word_embeddings"]}  # fmt: skip
    mm = {
        (k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v
        for k, v in w.items()
    }
    mm["model.visual.blocks.0.attn.qkv.weight"] = np.ones((6, 4), np.float32)
    convert(write_hf(tmp_path / "mm", outer, mm), tmp_path / "mm.gguf", "f32", threads=1)
    a = _gguf_tensors(tmp_path / "text.gguf")
    assert "blk.6.nextn.eh_proj.weight" in a
    for other in ("mm", "under"):
        b = _gguf_tensors(tmp_path / f"{other}.gguf")
        assert set(a) == set(b)
        assert all(np.array_equal(a[n][1], b[n][1]) for n in a), other
        assert _blocks(tmp_path / f"{other}.gguf", "qwen3_5") == (7, 1)
    assert np.array_equal(
        _model(tmp_path / "mm.gguf").eval(IDS, logits="all"),
        _model(tmp_path / "text.gguf").eval(IDS, logits="all"),
    )


@pytest.mark.parametrize("kind", KINDS)
def test_hf_conversion_q4_k_m_counts_layers_as_llama_quantize(tmp_path, kind: str) -> None:
    """q4_k_m's more-bits layers (use_more_bits) counted as llama-quantize counts them in the file llama.cpp's
    converter writes: attn_v together with the delta-nets' attn_qkv (llama-quant.cpp's category_is_attn_v),
    ffn_down over block_count, the MTP block among both. 7 layers + the MTP block: layers {0, 3, 6, 7}
    (counting 7 layers, or attn_v alone, would give others)."""
    from gguf import GGMLQuantizationType as QT

    from llamacy.convert.hf import HFSource
    from llamacy.convert.mixtures import TensorSpec, choose_types, target
    from tests.hf_qwen3next import write_hf

    c = hf_config(kind, num_hidden_layers=7)
    with HFSource(write_hf(tmp_path / "hf", c, random_weights(c, seed=1, mtp=True))) as src:
        specs = [TensorSpec(t.name, t.shape, src.keep_type(t)) for t in src.tensors]
        types = choose_types(specs, target("q4_k_m"), src.facts)
    sensitive = ("attn_v.weight", "attn_qkv.weight", "ffn_down.weight", "ffn_down_exps.weight",
                 "ffn_down_shexp.weight")  # fmt: skip
    by_layer: dict[int, set[int]] = {}
    for spec, ty in zip(specs, types, strict=True):
        if spec.name.endswith(sensitive):
            by_layer.setdefault(int(spec.name.split(".")[1]), set()).add(ty)
    assert sorted(by_layer) == list(range(8))
    # Rows of 32-96 values are not whole Q4_K / Q6_K blocks: Q4_K falls back to Q5_0, Q6_K to Q8_0.
    assert {i for i, t in by_layer.items() if t == {QT.Q8_0}} == {0, 3, 6, 7}
    assert all(t == {QT.Q5_0} for i, t in by_layer.items() if i not in (0, 3, 6, 7))
