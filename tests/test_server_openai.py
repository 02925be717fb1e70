"""The rest of OpenAI's API on the real server, with the official openai client: n choices (whole and
streamed), stream_options.include_usage, logit_bias; and llama.cpp's /tokenize and /detokenize (httpx)."""

from __future__ import annotations

import json
from collections import defaultdict

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")

from llamacy.errors import UsageError  # noqa: E402
from llamacy.sampling import Sampler, SamplingParams  # noqa: E402
from tests.test_server import assert_error, chat_ids, running_server, solo_text  # noqa: E402

STOP = ["<|im_end|>", "<|im_start|>"]  # the tiny model's ChatML template ends turns with these


@pytest.fixture
def client(tiny_server):
    return openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def http(tiny_server):
    with httpx.Client(base_url=tiny_server.url, timeout=30) as c:
        yield c


# ---- n choices ---------------------------------------------------------------------------------------


def test_n_choices_completion(tiny_llm, client):
    r = client.completions.create(model="tiny", prompt="Once upon", max_tokens=8, n=4, seed=11, temperature=1)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    # Each choice is its own sequence, seeded seed + index: choice 0 is what n=1 gives.
    want = [solo_text(tiny_llm, "Once upon", 8, temperature=1, seed=11 + i) for i in range(4)]
    assert [c.text for c in r.choices] == want
    assert len(set(want)) > 1
    assert r.usage.prompt_tokens == len(tiny_llm.tokenize("Once upon"))
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    ones = [
        client.completions.create(model="tiny", prompt="Once upon", max_tokens=8, seed=11 + i, temperature=1)
        for i in range(4)
    ]
    assert [one.choices[0].text for one in ones] == want
    assert r.usage.completion_tokens == sum(one.usage.completion_tokens for one in ones)
    # Echo and logprobs per choice.
    r = client.completions.create(
        model="tiny", prompt="Hi", max_tokens=3, n=2, temperature=0, echo=True, logprobs=1
    )
    for c in r.choices:
        assert c.text.startswith("Hi") and c.logprobs.text_offset[0] == 2


def test_n_choices_chat_stream(tiny_llm, client):
    messages = [{"role": "user", "content": "Tell me a story"}]
    want = [
        solo_text(tiny_llm, chat_ids(tiny_llm, messages), 10, temperature=0.9, seed=3 + i, stop=STOP)
        for i in range(3)
    ]
    whole = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, n=3, seed=3, temperature=0.9
    )
    assert [(c.index, c.message.content) for c in whole.choices] == list(enumerate(want))
    text: dict[int, str] = defaultdict(str)
    roles, finishes = set(), {}
    for chunk in client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, n=3, seed=3, temperature=0.9, stream=True
    ):
        assert len(chunk.choices) == 1
        c = chunk.choices[0]
        if c.delta.role:
            roles.add(c.index)
        text[c.index] += c.delta.content or ""
        if c.finish_reason:
            assert c.index not in finishes
            finishes[c.index] = c.finish_reason
    assert roles == {0, 1, 2} and set(finishes) == {0, 1, 2}
    assert [text[i] for i in range(3)] == want
    assert finishes == {c.index: c.finish_reason for c in whole.choices}


# ---- stream_options.include_usage --------------------------------------------------------------------


def test_include_usage(tiny_llm, client, http):
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=6,
            temperature=0,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    *body, last = chunks
    assert last.choices == [] and last.usage is not None
    assert all(c.usage is None and len(c.choices) == 1 for c in body)
    ids = chat_ids(tiny_llm, [{"role": "user", "content": "Hi"}])
    assert last.usage.prompt_tokens == len(ids)
    want = solo_text(tiny_llm, ids, 6, temperature=0, stop=STOP)
    assert "".join(c.choices[0].delta.content or "" for c in body if c.choices[0].index == 1) == want
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    # The raw stream: `usage: null` on every chunk (OpenAI's way), then the usage chunk, then [DONE].
    body = {"prompt": "Hi", "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/completions", json=body) as r:
        lines = [ln.removeprefix("data: ") for ln in r.iter_lines() if ln]
    assert lines[-1] == "[DONE]"
    events = [json.loads(x) for x in lines[:-1]]
    assert all("usage" in e for e in events) and all(e["usage"] is None for e in events[:-1])
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] <= 4
    # Without include_usage: no trailing usage chunk (the finishing chunk carries its own, as before).
    plain = list(client.completions.create(model="tiny", prompt="Hi", max_tokens=4, stream=True))
    assert all(len(c.choices) == 1 for c in plain)


# ---- logit_bias --------------------------------------------------------------------------------------


def test_logit_bias_in_the_sampler():
    logits = np.array([3.0, 1.0, 0.5, 2.0], dtype=np.float32)
    before = logits.copy()
    greedy = dict(temperature=0.0)
    assert Sampler(SamplingParams(**greedy), 4).sample(logits) == 0
    assert Sampler(SamplingParams(**greedy, logit_bias={2: 5.0}), 4).sample(logits) == 2
    assert Sampler(SamplingParams(**greedy, logit_bias={0: -100}), 4).sample(logits) == 3
    ids, probs = Sampler(SamplingParams(top_k=0, top_p=1, min_p=0, logit_bias={1: 2.0}), 4).distribution(
        logits
    )
    assert list(ids) == [0, 1, 3, 2]  # token 1 moved from 1.0 to 3.0: tied with 0, after it by id
    assert probs[0] == pytest.approx(probs[1])
    np.testing.assert_array_equal(logits, before)  # the caller's logits are not changed
    for bad, match in [({-1: 1.0}, "token ids"), ({"5": 1.0}, "token ids"), ({1: 100.5}, r"logit_bias\[1\]")]:
        with pytest.raises(UsageError, match=match):
            SamplingParams(logit_bias=bad).validate()
    with pytest.raises(UsageError, match="outside the vocabulary"):
        Sampler(SamplingParams(logit_bias={4: 1.0}), 4)


def test_logit_bias_through_the_api(tiny_llm, client):
    greedy = client.completions.create(model="tiny", prompt="Hello", max_tokens=5, temperature=0)
    first = tiny_llm.tokenize(greedy.choices[0].text, add_bos=False)[0]
    # -100 on the greedy first token: the answer starts differently, as the engine gives it.
    r = client.completions.create(
        model="tiny", prompt="Hello", max_tokens=5, temperature=0, logit_bias={str(first): -100}
    )
    assert r.choices[0].text != greedy.choices[0].text
    assert r.choices[0].text == solo_text(tiny_llm, "Hello", 5, temperature=0, logit_bias={first: -100})
    # +100 on one token: every sampled token is that one (seeded sampling, not greedy).
    target = tiny_llm.tokenize(" the", add_bos=False)[-1]
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=6,
        seed=1,
        logit_bias={str(target): 100},
        logprobs=True,
    )
    sampled = [tiny_llm.tokenizer.token_bytes(target).decode()] * 6
    assert [t.token for t in r.choices[0].logprobs.content] == sampled


# ---- /tokenize and /detokenize -----------------------------------------------------------------------


def test_tokenize_detokenize(tiny_llm, http):
    tok = tiny_llm.tokenizer
    text = "Hello world, <|im_start|>user"
    r = http.post("/tokenize", json={"content": text})
    assert r.status_code == 200
    ids = r.json()["tokens"]
    assert ids == tok.encode(text, special=True) and all(isinstance(t, int) for t in ids)
    assert http.post("/tokenize", json={"content": text, "parse_special": False}).json()["tokens"] == (
        tok.encode(text, special=False)
    )
    with_bos = http.post("/tokenize", json={"content": text, "add_special": True}).json()["tokens"]
    assert with_bos == ([tok.bos_id] if tok.add_bos else []) + ids
    pieces = http.post("/tokenize", json={"content": "Hello world", "with_pieces": True}).json()["tokens"]
    assert "".join(p["piece"] for p in pieces) == "Hello world"
    assert [p["id"] for p in pieces] == tok.encode("Hello world")
    r = http.post("/detokenize", json={"tokens": ids})
    assert r.status_code == 200 and r.json() == {"content": text}
    assert http.post("/detokenize", json={"tokens": []}).json() == {"content": ""}
    assert_error(http.post("/detokenize", json={"tokens": [0, tok.n_vocab]}), 400, "outside the vocabulary")
    assert_error(http.post("/detokenize", json={"tokens": ["a"]}), 400, "tokens")
    assert_error(http.post("/tokenize", json={"text": "x"}), 400, "missing required field: content")
    # One model served: any name is that model (a 404 with several: test_server.py).
    r = http.post("/tokenize", json={"content": "x", "model": "nope"})
    assert r.status_code == 200 and r.json() == http.post("/tokenize", json={"content": "x"}).json()


@pytest.mark.model
def test_tokenize_with_a_client_and_the_real_model(default_model_path):
    """The default model, end to end: /tokenize's ids are what the completion endpoint counts."""
    from llamacy import Llama

    tiny_llm = Llama(default_model_path, n_ctx=128, n_threads=2)
    with running_server(tiny_llm, parallel=1) as (srv, _sched):
        ids = httpx.post(srv.url + "/tokenize", json={"content": "The capital of France is"}).json()["tokens"]
        cli = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        r = cli.completions.create(
            model="tiny", prompt="The capital of France is", max_tokens=3, temperature=0
        )
        assert r.usage.prompt_tokens == len(ids)
        back = httpx.post(srv.url + "/detokenize", json={"tokens": ids}).json()["content"]
        assert back == "The capital of France is"
