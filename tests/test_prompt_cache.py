"""`llamacy run --prompt-cache FILE`: the first run saves the evaluated prompt's memory, a later run whose
prompt starts the same way evaluates only the rest, and greedy output is the same as without the cache."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as QT

from tests.test_cli import assert_one_line_error, llamacy

PREAMBLE = "You are a careful assistant. " * 12


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def model_path(request, tmp_path_factory) -> Path:
    from tests.model_factory import write_tiny_model

    return write_tiny_model(
        tmp_path_factory.mktemp("pc") / f"{request.param}.gguf", arch=request.param, wtype=QT.Q8_0, n_ctx=512
    )


def _run(path: Path, prompt: str, *extra: str) -> tuple[str, int]:
    r = llamacy(
        "run", prompt, "-m", str(path), "-n", "12", "--temp", "0", "-t", "1", "-c", "512", "-v", *extra
    )
    assert r.returncode == 0, r.stderr.decode()
    evaluated = int(re.search(r"prompt (\d+) tok", r.stderr.decode()).group(1))
    return r.stdout.decode(), evaluated


def test_second_run_evaluates_only_new_tokens_with_identical_output(model_path, tmp_path):
    from llamacy import Llama

    tok = Llama(model_path, n_threads=1, n_ctx=512)
    cache = tmp_path / "prompt.cache"
    first, second = PREAMBLE + "Question one?", PREAMBLE + "Question one? And question two?"
    ids1, ids2 = tok.tokenize(first), tok.tokenize(second)
    common = next((i for i, (a, b) in enumerate(zip(ids1, ids2, strict=False)) if a != b), len(ids1))
    assert common >= len(ids1) - 2

    plain1, n1 = _run(model_path, first)
    cached1, c1 = _run(model_path, first, "--prompt-cache", str(cache))
    assert cached1 == plain1 and c1 == n1 == len(ids1)
    assert cache.stat().st_size > 0

    again, c_again = _run(model_path, first, "--prompt-cache", str(cache))
    assert again == plain1 and c_again == 1  # the last token is evaluated again for its logits

    plain2, n2 = _run(model_path, second)
    cached2, c2 = _run(model_path, second, "--prompt-cache", str(cache))
    assert cached2 == plain2 and n2 == len(ids2)
    assert (
        c2 == len(ids2) - common
    )  # the saved prompt's tokens that the new one starts with are not evaluated
    assert c2 <= len(ids2) - len(ids1) + 3


def test_a_cache_of_another_model_or_a_damaged_one_is_refused(model_path, tmp_path):
    from tests.model_factory import write_tiny_model

    cache = tmp_path / "p.cache"
    _run(model_path, "hello there", "--prompt-cache", str(cache))
    other = write_tiny_model(tmp_path / "other.gguf", arch="llama", wtype=QT.Q8_0, n_layer=3, n_ctx=512)
    base = ("-n", "4", "--temp", "0", "-t", "1", "-c", "512", "--prompt-cache", str(cache))
    assert_one_line_error(llamacy("run", "hello", "-m", str(other), *base), 1, "saved from another model")
    r = llamacy("run", "hello", "-m", str(model_path), "--kv-type", "f32", *base)
    assert_one_line_error(r, 1, "saved with --kv-type f16")
    cache.write_bytes(cache.read_bytes()[:-7])
    assert_one_line_error(llamacy("run", "hello", "-m", str(model_path), *base), 1, "checksum")
