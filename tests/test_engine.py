"""The Python API: generation, stop strings, context policy, KV reuse, OpenAI-shaped completions."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from llamacy import Llama
from llamacy.errors import ContextOverflowError, UsageError


@pytest.fixture
def tiny(tiny_model):
    return Llama(tiny_model("llama", QT.Q8_0), n_threads=1, n_ctx=64)


def test_greedy_generation_follows_argmax_of_logits(tiny):
    prompt = [5, 17, 42]
    out = list(tiny.generate_tokens(prompt, max_tokens=6, temperature=0))
    ids = [t for t, _ in out if t >= 0]
    # Each generated token must be the argmax of the logits over everything before it.
    seq = list(prompt)
    for t in ids:
        assert t == int(np.argmax(tiny.logits(seq)[-1]))
        seq.append(t)


def test_seed_reproduces_and_differs(tiny):
    a = [
        t
        for t, _ in tiny.generate_tokens([1, 2, 3], max_tokens=12, temperature=1.0, seed=7, top_k=0, min_p=0)
    ]
    b = [
        t
        for t, _ in tiny.generate_tokens([1, 2, 3], max_tokens=12, temperature=1.0, seed=7, top_k=0, min_p=0)
    ]
    c = [
        t
        for t, _ in tiny.generate_tokens([1, 2, 3], max_tokens=12, temperature=1.0, seed=8, top_k=0, min_p=0)
    ]
    assert a == b
    assert a != c


def test_max_tokens_and_finish_reason(tiny):
    list(tiny.generate([1, 2], max_tokens=5, temperature=0))
    assert tiny.last.finish_reason in ("length", "stop")
    assert tiny.last.stats.gen_tokens <= 5


def test_context_full_ends_with_length(tiny_model):
    llm = Llama(tiny_model("llama", QT.Q8_0), n_threads=1, n_ctx=12)
    # Ban the end-of-generation tokens so that only the context can stop it.
    llm.tokenizer.eot_ids.clear()
    list(llm.generate([1, 2, 3], max_tokens=-1, temperature=0))
    assert llm.last.finish_reason == "length"
    assert llm.model.kv.length(0) == 12


def test_prompt_longer_than_context_is_a_clear_error(tiny_model):
    llm = Llama(tiny_model("llama", QT.Q8_0), n_threads=1, n_ctx=8)
    with pytest.raises(ContextOverflowError, match="context holds 8"):
        list(llm.generate(list(range(1, 20)), max_tokens=1))


def test_empty_prompt_is_a_clear_error(tiny):
    with pytest.raises(UsageError):
        list(tiny.generate("", max_tokens=1, add_bos=False))


def test_bad_sampling_values_rejected_before_work(tiny):
    with pytest.raises(UsageError):
        list(tiny.generate([1], temperature=float("nan")))
    with pytest.raises(UsageError):
        list(tiny.generate([1], top_p=2.0))


def test_kv_cache_reuses_common_prefix(tiny):
    list(tiny.generate([1, 2, 3, 4, 5, 6], max_tokens=3, temperature=0))
    generated = tiny.last.tokens
    # Continue the same conversation: only the new tokens are evaluated.
    follow = [1, 2, 3, 4, 5, 6, *generated[:2], 9, 10]
    list(tiny.generate(follow, max_tokens=1, temperature=0))
    assert tiny.last.stats.prompt_evaluated == 2
    # Same result as from scratch.
    cached = tiny.model.kv.tokens[0][: len(follow)]
    assert cached == follow


def test_logits_from_empty_cache_ignore_history(tiny):
    first = tiny.logits([3, 4, 5])
    list(tiny.generate([9, 9, 9, 9], max_tokens=2, temperature=0))
    np.testing.assert_array_equal(tiny.logits([3, 4, 5]), first)


def test_create_completion_shape(tiny):
    r = tiny.create_completion("hello", max_tokens=4, temperature=0)
    assert r["object"] == "text_completion"
    choice = r["choices"][0]
    assert choice["finish_reason"] in ("stop", "length")
    assert r["usage"]["completion_tokens"] <= 4
    chunks = list(tiny.create_completion("hello", max_tokens=4, temperature=0, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]


@pytest.mark.model
def test_default_model_says_paris(default_model_path):
    llm = Llama(default_model_path, n_ctx=128)
    assert llm.tokenize("The capital of France is", add_bos=False) == [504, 3575, 282, 4649, 314]
    text = "".join(llm.generate("The capital of France is", max_tokens=4, temperature=0))
    assert text.startswith(" Paris.")


@pytest.mark.model
def test_stop_string_split_across_tokens(default_model_path):
    llm = Llama(default_model_path, n_ctx=128)
    full = "".join(llm.generate("The capital of France is", max_tokens=12, temperature=0))
    assert "\n\n" in full  # " Paris.\n\nThe ..." as the reference engine continues
    cut = "".join(llm.generate("The capital of France is", max_tokens=12, temperature=0, stop=["s.\n"]))
    assert cut == full[: full.index("s.\n")]
    assert llm.last.finish_reason == "stop"


def test_kv_reuse_prefix_leaves_the_last_token_to_evaluate(tiny):
    kv = tiny.model.kv
    assert kv.reuse_prefix(0, [1, 2, 3]) == 0  # empty cache
    kv.append(0, [1, 2, 3, 4])
    assert kv.reuse_prefix(0, [1, 2, 3, 4]) == 3  # all cached: the last is evaluated again for its logits
    assert kv.tokens[0] == [1, 2, 3]
    assert kv.reuse_prefix(0, [1, 2, 9, 9]) == 2 and kv.tokens[0] == [1, 2]
    assert kv.reuse_prefix(0, [7]) == 0 and kv.length(0) == 0


def test_the_single_sequence_model_is_built_on_first_use(tiny_model):
    llm = Llama(tiny_model("llama", QT.Q8_0), n_threads=1, n_ctx=32)
    assert llm._session is None and llm.last is None
    llm.reset()  # nothing to forget yet, and nothing built for it
    assert llm._session is None
    list(llm.generate([1, 2], max_tokens=2, temperature=0))
    assert llm.model.kv.length(0) >= 2 and llm.last.stats.load_s == llm.load_s
