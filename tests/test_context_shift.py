"""Prompts longer than the context (issue #28): with --context-shift a conversation drops its oldest turns,
never its system prompt, and keeps answering; without it the answer is the 400 that names the sizes."""

from __future__ import annotations

import httpx
import pytest

from llamacy.server.context_shift import fit_messages, truncate_prompt
from tests.test_server import running_server

SYSTEM = {"role": "system", "content": "Be brief."}


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from llamacy import Llama
    from tests.model_factory import write_tiny_model

    return Llama(write_tiny_model(tmp_path_factory.mktemp("shift") / "tiny.gguf"), n_ctx=128, n_threads=1)


def _chat(c: httpx.Client, messages: list[dict]) -> httpx.Response:
    return c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "temperature": 0})


def test_ten_turns_far_beyond_the_context_keep_answering_with_the_system_prompt(llm):
    from llamacy.chat_template import ChatTemplate

    tpl = ChatTemplate.from_model(llm.metadata, llm.tokenizer)
    with (
        running_server(llm, parallel=1, context_shift=True) as (srv, _),
        httpx.Client(base_url=srv.url, timeout=30) as c,
    ):
        messages = [SYSTEM]
        for turn in range(10):
            messages.append({"role": "user", "content": f"turn {turn}: tell me more about it"})
            r = _chat(c, messages)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["prompt_tokens"] <= 128 - 32
            messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
        whole = tpl.encode(tpl.render(messages, add_generation_prompt=True))
        assert len(whole) > 3 * 128  # the conversation is far beyond the context
    encode = lambda m: (None, tpl.encode(tpl.render(m, add_generation_prompt=True)))  # noqa: E731
    kept, _, ids = fit_messages(messages, encode, 128)
    assert kept[0] == SYSTEM and kept[1]["role"] == "user" and kept[-1] == messages[-1]
    assert len(ids) <= 96 and len(kept) < len(messages)
    with running_server(llm, parallel=1) as (srv, _), httpx.Client(base_url=srv.url, timeout=30) as c:
        r = _chat(c, messages)
        assert r.status_code == 400
        msg = r.json()["error"]["message"]
        assert (
            "tokens but the context holds 128" in msg
            and r.json()["error"]["code"] == "context_length_exceeded"
        )


def test_plain_prompts_keep_their_first_tokens_and_their_end(llm):
    ids = list(range(300))
    got = truncate_prompt(ids, 128, 10)
    assert len(got) < 128 and got[:10] == ids[:10] and got[-1] == 299
    assert truncate_prompt(ids[:100], 128, 10) == ids[:100]
    with (
        running_server(llm, parallel=1, context_shift=True, keep=4) as (srv, _),
        httpx.Client(base_url=srv.url, timeout=30) as c,
    ):
        r = c.post("/v1/completions", json={"prompt": ids[3:250], "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] < 128


def test_responses_truncation_auto_per_request(llm):
    with running_server(llm, parallel=1) as (srv, _), httpx.Client(base_url=srv.url, timeout=30) as c:
        long = [{"role": "user", "content": f"turn {i}: a long message about many things"} for i in range(12)]
        body = {"input": long, "instructions": "Be brief.", "max_output_tokens": 4, "temperature": 0}
        assert c.post("/v1/responses", json=body).status_code == 400
        r = c.post("/v1/responses", json={**body, "truncation": "auto"})
        assert r.status_code == 200, r.text
        assert r.json()["truncation"] == "auto" and r.json()["usage"]["input_tokens"] < 128
