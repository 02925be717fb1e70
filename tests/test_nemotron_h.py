"""Nemotron-H (GGUF nemotron_h) and Nemotron 3 Nano (nemotron_h_moe): Mamba2, NoPE attention, ReLU² MLP and
sigmoid-routed ungated MoE layers, converted from tiny random NemotronHForCausalLM checkpoints
(tests/hf_nemotron_h.py) and held to a float64 numpy forward pass written from the Hugging Face code; then
the recurrent state's contract: every path through it (threads, chunks, batching, rollback) bit-identical.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from llamacy.engine import Llama
from llamacy.errors import UnsupportedModelError
from tests.hf_nemotron_h import (
    NemotronHModel,
    llama_cpp_tensors,
    write_llama_cpp_file,
    write_nemotron_h_hf_model,
)
from tests.test_convert import rel_rms

HF_F32_BOUND = 1e-4
Q8_BOUND = 0.06
# dense: Mamba2, attention (GQA) and MLP layers; moe: with MoE layers, without and with the latent projection
VARIANTS = {"dense": {}, "moe": {"moe": True}, "moe_latent": {"moe": True, "latent": 32}}
IDS = [5, 17, 42, 99, 3, 250, 31, 8, 64, 120, 7, 77, 200, 11, 150, 19, 90, 45, 260, 33, 2, 140]


def _hf(tmp_path: Path, variant: str, seed: int = 0) -> NemotronHModel:
    return write_nemotron_h_hf_model(tmp_path / f"hf-{variant}", seed=seed, **VARIANTS[variant])


def _convert(model: NemotronHModel, out: Path, qtype: str = "f32") -> Path:
    from llamacy.convert import convert

    convert(model.path, out, qtype, threads=1)
    return out


def _llm(path: Path, n_threads: int = 1, **kw) -> Llama:
    return Llama(path, n_threads=n_threads, n_ctx=64, kv_type="f32", **kw)


def _decode(path: Path, ids: list[int], n_threads: int = 1) -> np.ndarray:
    llm = _llm(path, n_threads)
    return np.stack([llm.model.eval([t], logits="last") for t in ids])


def _all(path: Path, ids: list[int], n_threads: int = 1) -> np.ndarray:
    return _llm(path, n_threads).model.eval(ids, logits="all")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, tuple[NemotronHModel, Path]]:
    d = tmp_path_factory.mktemp("nemotron_h")
    out = {}
    for i, v in enumerate(VARIANTS):
        model = _hf(d, v, seed=i)
        out[v] = (model, _convert(model, d / f"{v}.gguf"))
    return out


# ---------------------------------------------------------------------------------------------------------
# Conversion, against the Hugging Face oracle


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_hf_f32_conversion_matches_hugging_face_forward(files, variant: str) -> None:
    model, path = files[variant]
    want = model.logits(IDS)
    assert 0.3 < want.std() < 20 and len(set(want.argmax(1).tolist())) > len(IDS) // 3  # not degenerate
    got = _all(path, IDS)
    assert rel_rms(got, want) < HF_F32_BOUND, f"prefill: relative RMS error {rel_rms(got, want):.2e}"
    steps = _decode(path, IDS)
    assert rel_rms(steps, want) < HF_F32_BOUND, f"decode: relative RMS error {rel_rms(steps, want):.2e}"


def test_hf_conversion_layout(files) -> None:
    """Architectures, the per-layer pattern arrays, the ssm keys and the tensors' llama.cpp shapes."""
    from llamacy.gguf import GGUFFile

    for variant, arch in (("dense", "nemotron_h"), ("moe_latent", "nemotron_h_moe")):
        model, path = files[variant]
        f = GGUFFile(path)
        md = f.metadata
        assert md["general.architecture"] == arch
        c = model.config
        pattern = c["hybrid_override_pattern"]
        assert list(md[f"{arch}.attention.head_count_kv"]) == [2 if ch == "*" else 0 for ch in pattern]
        ff = c["moe_intermediate_size"] if "moe_intermediate_size" in c else c["intermediate_size"]
        assert list(md[f"{arch}.feed_forward_length"]) == [ff if ch in "-E" else 0 for ch in pattern]
        assert (
            md[f"{arch}.ssm.conv_kernel"],
            md[f"{arch}.ssm.inner_size"],
            md[f"{arch}.ssm.state_size"],
        ) == (4, 128, 16)
        assert (md[f"{arch}.ssm.group_count"], md[f"{arch}.ssm.time_step_rank"]) == (2, 8)
        want = llama_cpp_tensors(model)
        assert set(f.tensors) == set(want)
        for name, a in want.items():
            t = f.tensors[name]
            assert tuple(t.shape) == a.shape and t.type == QT.F32, name
            assert np.array_equal(t.data.view(np.float32).reshape(a.shape), a), name
        if arch == "nemotron_h_moe":
            assert md[f"{arch}.moe_latent_size"] == 32 and md[f"{arch}.expert_weights_norm"] is True
            assert md[f"{arch}.expert_weights_scale"] == pytest.approx(2.5)


def test_hf_q8_0_conversion(files, tmp_path) -> None:
    """q8_0: every quantizable matrix Q8_0 with the bytes gguf.quants.quantize makes of the f32 values; the
    tensors llama-quantize keeps (ssm_conv1d, ssm_a, ssm_d, norms, biases, the router) F32 and unchanged."""
    from gguf.quants import quantize

    from llamacy.gguf import GGUFFile

    for variant in ("dense", "moe_latent"):
        model, f32 = files[variant]
        q8 = _convert(model, tmp_path / f"{variant}-q8.gguf", "q8_0")
        err = rel_rms(_all(q8, IDS), model.logits(IDS))
        assert err < Q8_BOUND, f"relative RMS error {err:.3f}"
        a, b = GGUFFile(f32), GGUFFile(q8)
        for name, t in b.tensors.items():
            src = a.tensors[name]
            values = src.data.view(np.float32).reshape(src.shape)
            kept = values.ndim == 1 or any(
                s in name for s in ("ssm_conv1d", "ssm_a", "ssm_d", "_norm.", "gate_inp")
            )
            if kept:
                assert t.type == QT.F32 and np.array_equal(t.data, src.data), name
            else:
                assert t.type == QT.Q8_0, name
                assert np.array_equal(t.data, quantize(values, QT.Q8_0).view(np.uint8).reshape(-1)), name


# ---------------------------------------------------------------------------------------------------------
# A file written the way llama.cpp's converter writes it


@pytest.mark.parametrize("variant", ["dense", "moe_latent"])
def test_llama_cpp_written_file_loads_and_matches(files, tmp_path, variant: str) -> None:
    model, ours = files[variant]
    twin = write_llama_cpp_file(model, tmp_path / "twin.gguf")
    got = _all(twin, IDS)
    np.testing.assert_array_equal(got, _all(ours, IDS))  # the same tensors: the same arithmetic
    assert rel_rms(got, model.logits(IDS)) < HF_F32_BOUND


def test_multi_token_prediction_block_is_loaded_past(files, tmp_path) -> None:
    """llama.cpp's converter appends Nemotron 3's MTP block by default: such a file loads, runs without it."""
    model, ours = files["moe_latent"]
    twin = write_llama_cpp_file(model, tmp_path / "mtp.gguf", mtp=True)
    llm = _llm(twin)
    assert llm.model.cfg.n_layer == len(model.config["hybrid_override_pattern"])
    np.testing.assert_array_equal(llm.model.eval(IDS, logits="all"), _all(ours, IDS))
    from llamacy.cli.info import _layer_mix, describe

    d = describe(str(twin), None)
    assert (d["mtp_blocks"], describe(str(ours), None)["mtp_blocks"]) == (1, 0)
    assert _layer_mix(d).endswith("; 1 multi-token-prediction block in the file, not run")


def test_bad_files_are_refused_in_one_line(files, tmp_path) -> None:
    model, _ = files["dense"]
    good = llama_cpp_tensors(model)
    missing = {k: v for k, v in good.items() if k != "blk.0.ssm_d"}
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.ssm_d is missing") as e:
        _llm(write_llama_cpp_file(model, tmp_path / "missing.gguf", missing))
    assert "\n" not in str(e.value)
    wrong = dict(good, **{"blk.0.ssm_conv1d.weight": good["blk.0.ssm_conv1d.weight"][:, :3].copy()})
    with pytest.raises(UnsupportedModelError, match=r"ssm_conv1d\.weight has shape") as e:
        _llm(write_llama_cpp_file(model, tmp_path / "wrong.gguf", wrong))
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------------------
# The recurrent state: every way through it gives the same bits


@pytest.mark.parametrize("variant", ["dense", "moe_latent"])
def test_threads_chunks_and_decode_are_bit_identical(files, variant: str) -> None:
    _, path = files[variant]
    whole = _all(path, IDS)
    np.testing.assert_array_equal(_all(path, IDS, n_threads=2), whole)
    m = _llm(path).model
    chunks = np.concatenate([m.eval(IDS[a:b], logits="all") for a, b in ((0, 5), (5, 12), (12, len(IDS)))])
    np.testing.assert_array_equal(chunks, whole)
    np.testing.assert_array_equal(_decode(path, IDS), whole)
    np.testing.assert_array_equal(_decode(path, IDS, n_threads=2), whole)


@pytest.mark.parametrize("variant", ["dense", "moe"])
def test_sequences_batched_together_equal_each_alone(files, variant: str) -> None:
    """Two sequences, a prompt chunk each, then one token of each per step in one batch."""
    from llamacy.gguf import GGUFFile
    from llamacy.model import Model

    _, path = files[variant]
    a, b = IDS[:14], IDS[3:12][::-1]
    alone = [_all(path, s) for s in (a, b)]
    m = Model(GGUFFile(path), n_ctx=64, n_threads=1, n_seq=2, kv_type="f32")
    starts = (5, 3)
    for s, ids, start in ((0, a, starts[0]), (1, b, starts[1])):
        m.eval_batch(np.array(ids[:start]), np.arange(start), np.full(start, s), np.array([], np.int32))
        m.kv.append(s, ids[:start])
    got: dict[int, list[np.ndarray]] = {0: [], 1: []}
    for step in range(max(len(a) - starts[0], len(b) - starts[1])):
        toks, pos, seq = [], [], []
        for s, ids, start in ((0, a, starts[0]), (1, b, starts[1])):
            if start + step < len(ids):
                toks.append(ids[start + step])
                pos.append(start + step)
                seq.append(s)
        out = m.eval_batch(np.array(toks), np.array(pos), np.array(seq), np.arange(len(toks)))
        for row, (s, t) in enumerate(zip(seq, toks, strict=True)):
            got[s].append(out[row])
            m.kv.append(s, [t])
    np.testing.assert_array_equal(np.stack(got[0]), alone[0][starts[0] :])
    np.testing.assert_array_equal(np.stack(got[1]), alone[1][starts[1] :])


@pytest.mark.parametrize("variant", ["dense", "moe_latent"])
def test_rollback_by_truncate_is_bit_identical(files, variant: str) -> None:
    """After a multi-token run, going back up to n_snap - 1 tokens (a rejected draft) and evaluating the
    same tokens again gives the same bits."""
    _, path = files[variant]
    m = _llm(path).model
    first = m.eval(IDS[:12], logits="all")
    n_snap = m.kv.n_snap
    assert n_snap >= 2
    for back in range(1, min(n_snap, 12)):
        m.kv.truncate(0, 12 - back)
        again = m.eval(IDS[12 - back : 12], logits="all")
        np.testing.assert_array_equal(again, first[12 - back :])


def test_every_declared_tensor_is_named_from_the_gguf_table(files) -> None:
    """Every layer kind's tensors come from the gguf package's table and its list for the architecture."""
    from gguf import TENSOR_NAMES

    from llamacy.gguf import GGUFFile
    from llamacy.model.archs import ARCHITECTURES, config_from_metadata

    for variant in ("dense", "moe_latent"):
        path = files[variant][1]
        cfg = config_from_metadata(GGUFFile(path).metadata, str(path))
        a = ARCHITECTURES[cfg.arch]
        assert set(cfg.layer_mixer) == {"mamba2", "attention", "none"}
        for il in range(cfg.n_layer):
            for spec in a.model_tensors(cfg) + a.layer_tensors(cfg, il):
                assert spec.tensor in a.gguf_tensors, spec
                base = TENSOR_NAMES[spec.tensor].format(bid=il)
                assert spec.name == base or spec.name.rsplit(".", 1)[0] == base, spec
