"""Embeddings: the final hidden states against the numpy oracle, pooling, normalisation, the API, the CLI."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from llamacy.embedding import Embedder, l2_normalize, pooling_from_metadata
from llamacy.engine import Llama
from llamacy.errors import ContextOverflowError, UnsupportedModelError, UsageError
from tests.reference.numpy_forward import reference_hidden
from tests.test_cli import assert_one_line_error, llamacy

ARCHS = ["llama", "qwen2", "qwen3", "gemma3"]


def _ids(n_vocab: int, n: int = 20, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, n_vocab, n).tolist()


def _embedder(llm: Llama, pooling: str | None = None) -> Embedder:
    return Embedder(llm.gguf, llm.config, llm.n_ctx, 1, pooling=pooling)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


@pytest.mark.parametrize("arch", ARCHS)
def test_hidden_states_match_oracle(tiny_model, arch):
    path = tiny_model(arch, QT.F32)
    llm = Llama(path, n_threads=1, kv_type="f32")
    ids = _ids(llm.n_vocab)
    got = llm.model.eval(ids, logits="all", hidden=True)
    assert got.shape == (len(ids), llm.config.n_embd) and got.dtype == np.float32
    np.testing.assert_allclose(got, reference_hidden(path, ids), atol=1e-4, rtol=0)


def test_hidden_rows_are_the_ones_asked_for_and_logits_stay_as_they_were(tiny_model):
    path = tiny_model("qwen2", QT.Q8_0)
    llm = Llama(path, n_threads=1)
    ids = _ids(llm.n_vocab, 12)
    logits_before = llm.logits(ids)
    llm.reset()
    everything = llm.model.eval(ids, logits="all", hidden=True)
    llm.reset()
    last = llm.model.eval(ids, hidden=True)
    np.testing.assert_array_equal(last, everything[-1])
    # Micro-batches of 5: the rows asked for straddle them.
    chunked = Llama(path, n_threads=1, n_batch=5)
    rows = np.array([0, 4, 5, 11], np.int32)
    n = len(ids)
    some = chunked.model.eval_batch(np.array(ids), np.arange(n), np.zeros(n), rows, hidden=True)
    np.testing.assert_allclose(some, everything[rows], atol=1e-5, rtol=1e-5)
    llm.reset()
    np.testing.assert_array_equal(llm.logits(ids), logits_before)


@pytest.mark.slow
def test_smollm2_hidden_states_match_oracle(default_model_path):
    llm = Llama(default_model_path, n_ctx=256, kv_type="f32")
    text = "The capital of France is Paris. It is known for the Eiffel Tower, fine food and museums such as"
    ids = llm.tokenize(text)[:24]
    ref = reference_hidden(default_model_path, ids)
    got = llm.model.eval(ids, logits="all", hidden=True)
    # Measured (32 positions): max |Δ| 0.78 against max |h| 34 (2.3%), from the Q8 activations, as the
    # logits; every row's direction within cos 0.9991 of the oracle's, the mean-pooled one within 0.9998.
    assert np.abs(got - ref).max() / np.abs(ref).max() < 0.05
    cos = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.min() > 0.995
    vec = np.array(llm.embed(ids).vectors[0])
    assert float(vec @ _unit(ref.mean(0))) > 0.999


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_pooling_modes_against_oracle(tiny_model, pooling):
    path = tiny_model("llama", QT.F32)
    llm = Llama(path, n_threads=1, kv_type="f32")
    ids = _ids(llm.n_vocab, 10)
    ref = reference_hidden(path, ids)
    want = {"mean": ref.mean(0), "cls": ref[0], "last": ref[-1]}[pooling]
    got = _embedder(llm, pooling).embed([ids], normalize=False)[0]
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_pooling_from_metadata():
    def pooling(value):
        return pooling_from_metadata(
            {} if value is None else {"llama.pooling_type": value}, "llama", "m.gguf"
        )

    assert pooling(None) == "mean"  # a decoder that says nothing
    assert [pooling(v) for v in (0, 1, 2, 3)] == ["mean", "mean", "cls", "last"]
    with pytest.raises(UnsupportedModelError, match="reranking"):
        pooling(4)
    for bad in (7, -1, "mean", True):
        with pytest.raises(UnsupportedModelError, match="not a known pooling type"):
            pooling(bad)


def test_the_files_pooling_type_is_used(tiny_model):
    path = tiny_model("llama", QT.F32)
    llm = Llama(path, n_threads=1, kv_type="f32")
    ids = _ids(llm.n_vocab, 10)
    llm.gguf.metadata["llama.pooling_type"] = 3  # as a file with the key would read
    got = llm.embed(ids, normalize=False).vectors[0]
    np.testing.assert_allclose(got, reference_hidden(path, ids)[-1], atol=1e-4, rtol=0)
    ranker = Llama(path, n_threads=1)
    ranker.gguf.metadata["llama.pooling_type"] = 4
    with pytest.raises(UnsupportedModelError, match="reranking"):
        ranker.embed("hello")


def test_normalisation(tiny_model):
    llm = Llama(tiny_model("gemma3", QT.Q8_0), n_threads=1)
    texts = ["The capital of France is Paris", "hello", "and the cat"]
    unit = np.array(llm.embed(texts).vectors)
    raw = np.array(llm.embed(texts, normalize=False).vectors)
    assert unit.shape == (3, llm.config.n_embd)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-6)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    np.testing.assert_allclose(unit, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-6)
    zero = l2_normalize(np.zeros((1, 4), np.float32))  # no division by zero: it stays zero
    np.testing.assert_array_equal(zero, np.zeros((1, 4), np.float32))


def test_several_inputs_equal_one_at_a_time(tiny_model):
    llm = Llama(tiny_model("qwen3", QT.Q4_0), n_threads=1)
    texts = ["The capital of France is Paris", "hello world", "a", "and the cat sat on the mat and then"]
    together = llm.embed(texts)
    alone = [llm.embed(t).vectors[0] for t in texts]
    assert together.vectors == alone
    assert together.input_tokens == [len(llm.tokenize(t)) for t in texts]
    assert together.n_tokens == sum(together.input_tokens)


def test_text_token_ids_and_lists_of_them_agree(tiny_model):
    llm = Llama(tiny_model("llama", QT.Q8_0), n_threads=1)
    text = "The capital of France is Paris"
    ids = llm.tokenize(text)
    by_text = llm.embed(text).vectors
    assert llm.embed(ids).vectors == by_text
    assert llm.embed([ids, ids]).vectors == by_text * 2
    assert llm.embed([text, ids]).vectors == by_text * 2


def test_embedding_keeps_the_conversation_cache(tiny_model):
    path = tiny_model("llama", QT.Q8_0)
    llm, untouched = Llama(path, n_threads=1), Llama(path, n_threads=1)
    ids = _ids(llm.n_vocab, 8)
    llm.model.eval(ids)
    untouched.model.eval(ids)
    llm.embed("hello world and the cat")
    assert llm.model.kv.tokens[0] == ids
    # Decoding goes on from it as if nothing had happened.
    np.testing.assert_array_equal(llm.model.eval([5]), untouched.model.eval([5]))


def test_concurrent_callers_are_served_one_at_a_time(tiny_model):
    llm = Llama(tiny_model("qwen2", QT.Q8_0), n_threads=1)
    texts = [f"the cat {'and the mat ' * i}" for i in range(6)]
    want = [llm.embed(t).vectors[0] for t in texts]
    got: dict[int, list[float]] = {}

    def work(i: int) -> None:
        for _ in range(3):
            got[i] = llm.embed(texts[i]).vectors[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[i] for i in range(len(texts))] == want


def test_bad_inputs_fail_in_one_line(tiny_model):
    llm = Llama(tiny_model("llama", QT.Q8_0), n_threads=1, n_ctx=16)
    cases = [
        ([], UsageError, "nothing to embed"),
        ("", UsageError, "empty string"),
        (["hello", ""], UsageError, "input 1 is an empty string"),
        ([[1, 2], []], UsageError, "input 1 is empty"),
        ([1, 10**6], UsageError, "outside the vocabulary"),
        ([[1], [-1]], UsageError, "outside the vocabulary"),
        (3.5, UsageError, "cannot embed a float"),
        ([None], UsageError, "input 0 is a NoneType"),
        (list(range(1, 18)), ContextOverflowError, "17 tokens but the context holds 16"),
    ]
    for value, error, fragment in cases:
        with pytest.raises(error, match=fragment) as e:
            llm.embed(value)
        assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match="pooling must be one of"):
        _embedder(llm, "max")


# ---- the command line -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from tests.model_factory import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("embed") / "tiny.gguf", arch="llama", wtype=QT.Q8_0)


@pytest.mark.slow
def test_cli_prints_only_json_in_a_pipe(tiny_path, tmp_path):
    base = ("-m", str(tiny_path), "-t", "1")
    r = llamacy("embed", "hello world", *base)
    assert r.returncode == 0, r.stderr
    assert r.stderr == b""
    lines = r.stdout.decode().splitlines()
    assert len(lines) == 1
    want = Llama(tiny_path, n_threads=1).embed("hello world").vectors[0]
    assert json.loads(lines[0]) == want
    assert llamacy("embed", "-", *base, input=b"hello world\n").stdout == r.stdout

    f = tmp_path / "lines.txt"
    f.write_text("hello world\n\nthe cat\n  \nParis\n")
    r = llamacy("embed", "--file", str(f), *base)
    assert r.returncode == 0 and r.stderr == b""
    vecs = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert len(vecs) == 3 and vecs[0] == want
    assert llamacy("embed", "-f", "-", *base, input=f.read_bytes()).stdout == r.stdout

    raw = json.loads(llamacy("embed", "hello world", "--no-normalize", *base).stdout)
    np.testing.assert_allclose(_unit(np.array(raw)), want, atol=1e-6)


@pytest.mark.parametrize(
    "args, stdin, fragment",
    [
        ((), None, "nothing to embed"),
        (("hello", "-f", "x.txt"), None, "not both"),
        (("-f", "-"), b"\n \n", "no non-empty lines"),
        (("-f", "/nonexistent/lines.txt"), None, "cannot read input file"),
        (("",), None, "empty string"),
        (("the cat and the mat and the cat and the mat and the cat", "-c", "4"), None, "context holds 4"),
    ],
)
@pytest.mark.slow
def test_cli_errors_are_one_line(tiny_path, args, stdin, fragment):
    r = llamacy("embed", *args, "-m", str(tiny_path), "-t", "1", input=stdin)
    assert_one_line_error(r, 2, fragment)
