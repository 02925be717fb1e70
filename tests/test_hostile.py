"""Hostile input: mutated model files, odd prompts, absurd options. Clear errors, never a crash.

A mutated file must either load (and then generate) or fail with a LlamacyError (GGUFError,
UnsupportedModelError, ...). Anything else — IndexError, a segfault, a hang, a huge allocation — fails.
`make fuzz` runs many more cases (LLAMACY_FUZZ_EXAMPLES).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamacy import Llama
from llamacy.errors import LlamacyError
from llamacy.gguf import GGUFFile

EXAMPLES = int(os.environ.get("LLAMACY_FUZZ_EXAMPLES", "300"))


@pytest.fixture(scope="module")
def seed_file(tmp_path_factory) -> tuple[Path, bytes, int]:
    from tests.model_factory import write_tiny_model

    path = write_tiny_model(
        tmp_path_factory.mktemp("fuzz") / "seed.gguf", arch="llama", wtype=QT.Q4_0, n_layer=1
    )
    data = path.read_bytes()
    return path, data, GGUFFile(path).data_offset


def _load_and_run(path: Path) -> None:
    try:
        llm = Llama(path, n_threads=1, n_ctx=32)
        # It loaded: then it must also generate (garbage is fine, a crash is not).
        list(llm.generate([1, 2, 3], max_tokens=2, temperature=0))
    except LlamacyError:
        return


def _mutate_and_check(tmp_path: Path, data: bytes) -> None:
    p = tmp_path / "mutant.gguf"
    p.write_bytes(data)
    _load_and_run(p)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
@pytest.mark.slow
def test_flipped_header_bytes(tmp_path_factory, seed_file, data):
    _, raw, data_offset = seed_file
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, data_offset - 1))
        buf[i] = data.draw(st.integers(0, 255))
    _mutate_and_check(tmp_path_factory.mktemp("m"), bytes(buf))


@settings(max_examples=EXAMPLES // 3, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
@pytest.mark.slow
def test_absurd_integers_in_header(tmp_path_factory, seed_file, data):
    # Overwrite aligned 4- or 8-byte fields (counts, lengths, dims, offsets, types) with extreme values.
    _, raw, data_offset = seed_file
    buf = bytearray(raw)
    width = data.draw(st.sampled_from([4, 8]))
    i = data.draw(st.integers(0, (data_offset - width) // width)) * width
    value = data.draw(st.sampled_from([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**64 - 1, 255, 65536]))
    buf[i : i + width] = struct.pack("<I" if width == 4 else "<Q", value % (1 << (8 * width)))
    _mutate_and_check(tmp_path_factory.mktemp("m"), bytes(buf))


def test_every_truncation_point_in_header(tmp_path, seed_file):
    _, raw, data_offset = seed_file
    step = max(1, data_offset // 200)
    for cut in [*range(0, data_offset, step), data_offset + 10, len(raw) - 1]:
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(raw[:cut])
        with pytest.raises(LlamacyError):
            Llama(p, n_threads=1, n_ctx=32)


def test_tensor_data_garbage_still_runs(tmp_path, seed_file):
    # Random bytes in the weights (NaN/Inf scales included) must not crash the kernels.
    _, raw, data_offset = seed_file
    rng = np.random.default_rng(0)
    buf = bytearray(raw)
    buf[data_offset:] = rng.integers(0, 256, len(raw) - data_offset, dtype=np.uint8).tobytes()
    p = tmp_path / "garbage.gguf"
    p.write_bytes(bytes(buf))
    llm = Llama(p, n_threads=1, n_ctx=32)
    try:
        list(llm.generate([1, 2], max_tokens=3, temperature=0.7, seed=1))
    except LlamacyError as e:
        assert "non-finite logits" in str(e)


# ---- prompts ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(seed_file) -> Llama:
    return Llama(seed_file[0], n_threads=1, n_ctx=64)


@pytest.mark.parametrize(
    "text",
    [
        "\x00\x01\x02\x7f",
        "\u202e\u200b\ufeff",
        "<|im_start|><|im_end|><|endoftext|>",
        "\ud7ff\ue000\U0010ffff",
        "\r\n\t\v\f",
        "a" * 40,
    ],
)
def test_odd_prompts_generate(tiny, text):
    list(tiny.generate(text, max_tokens=2, temperature=0))
    assert tiny.last.finish_reason in ("stop", "length")


def test_huge_prompt_is_refused_not_truncated(tiny):
    from llamacy.errors import ContextOverflowError

    with pytest.raises(ContextOverflowError):
        list(tiny.generate("word " * 10_000, max_tokens=1))


def test_context_that_cannot_fit_is_refused_with_numbers(tmp_path, monkeypatch):
    from llamacy import memory
    from tests.model_factory import write_tiny_model

    path = write_tiny_model(tmp_path / "m.gguf", arch="llama", wtype=QT.Q8_0, n_ctx=1 << 20)
    monkeypatch.setattr(memory, "available_memory", lambda: 64 << 20)  # pretend 64 MiB are free
    with pytest.raises(memory.OutOfMemoryError, match=r"needs .* GiB .* KV cache .* only 0.06 GiB"):
        Llama(path, n_threads=1, n_ctx=1 << 20)
    Llama(path, n_threads=1, n_ctx=1024)  # a context that fits still loads


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
def test_memory_flat_over_5000_tokens(tmp_path):
    from tests.model_factory import write_tiny_model

    path = write_tiny_model(tmp_path / "m.gguf", arch="llama", wtype=QT.Q4_0, n_ctx=8192)
    llm = Llama(path, n_threads=1, n_ctx=8192)
    llm.tokenizer.eot_ids.clear()  # nothing may end it early
    samples = []
    for i, _ in enumerate(llm.generate_tokens([1, 2, 3], max_tokens=5000, temperature=1.0, seed=3)):
        if i % 500 == 499:
            samples.append(_rss())
    assert llm.last.stats.gen_tokens == 5000
    # After the first 500 tokens, growth is only the KV cache filling (committed page by page).
    kv_per_position = llm.config.kv_bytes(1)
    allowed = kv_per_position * 4500 + (4 << 20)
    assert samples[-1] - samples[0] < allowed, [s >> 10 for s in samples]
