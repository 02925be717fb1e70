"""Anthropic's Messages API on `llamacy serve`: the real server driven with the official anthropic client
(and raw HTTP for the event stream's exact sequence and for what the client cannot send). Greedy answers
are checked against the OpenAI chat endpoint of the same server; errors against Anthropic's shape."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

from llamacy.chat_template import ChatTemplate  # noqa: E402
from tests.test_server import chat_ids, running_server  # noqa: E402

MSGS = [{"role": "user", "content": "Hello there"}]
GREEDY = {"temperature": 0}  # the client has no temperature argument any more; the API still takes it


@pytest.fixture
def client(tiny_server):
    return anthropic.Anthropic(base_url=tiny_server.url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def http(tiny_server):
    with httpx.Client(base_url=tiny_server.url, timeout=60, headers={"anthropic-version": "2023-06-01"}) as c:
        yield c


def openai_chat(oai, messages, max_tokens=10, **kw):
    r = oai.chat.completions.create(
        model="tiny", messages=messages, max_tokens=max_tokens, temperature=0, **kw
    )
    return r.choices[0], r.usage


def sse(r: httpx.Response) -> list[tuple[str, dict]]:
    """(event, data) pairs of an SSE stream; the event name must repeat the data's type."""
    assert r.headers["content-type"].startswith("text/event-stream")
    out = []
    for block in r.text.split("\n\n"):
        if not block.strip():
            continue
        event, data = block.split("\n")
        assert event.startswith("event: ") and data.startswith("data: "), block
        name, obj = event[len("event: ") :], json.loads(data[len("data: ") :])
        assert obj["type"] == name
        out.append((name, obj))
    return out


def assert_anthropic_error(r: httpx.Response, status: int, kind: str, fragment: str = "") -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == kind and fragment.lower() in body["error"]["message"].lower(), body
    assert body["request_id"].startswith("req_") and r.headers["request-id"] == body["request_id"]


# ---- messages ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_message_equals_openai(client, tiny_oai, tiny_llm):
    choice, usage = openai_chat(tiny_oai, MSGS)
    m = client.messages.create(model="tiny", max_tokens=10, messages=MSGS, extra_body=GREEDY)
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant" and m.model == "tiny"
    assert [(b.type, b.text) for b in m.content] == [("text", choice.message.content)]
    assert m.usage.input_tokens == usage.prompt_tokens == len(chat_ids(tiny_llm, MSGS))
    assert m.usage.output_tokens == usage.completion_tokens
    want = {"length": "max_tokens", "stop": "end_turn"}[choice.finish_reason]
    assert m.stop_reason == want and m.stop_sequence is None
    # A system prompt is the template's system turn, as in the OpenAI request.
    choice, _ = openai_chat(tiny_oai, [{"role": "system", "content": "Be brief."}, *MSGS])
    m = client.messages.create(
        model="tiny", max_tokens=10, system="Be brief.", messages=MSGS, extra_body=GREEDY
    )
    assert m.content[0].text == choice.message.content
    blocks = [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]
    m = client.messages.create(model="tiny", max_tokens=10, system=blocks, messages=MSGS, extra_body=GREEDY)
    assert m.content[0].text == choice.message.content


def test_stream_event_sequence(client, tiny_oai, http):
    choice, usage = openai_chat(tiny_oai, MSGS)
    body = {"model": "tiny", "max_tokens": 10, "messages": MSGS, "stream": True, **GREEDY}
    events = sse(http.post("/v1/messages", json=body))
    names = [e for e, _ in events]
    n_deltas = names.count("content_block_delta")
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * n_deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["stop_sequence"] is None
    assert start["usage"] == {"input_tokens": usage.prompt_tokens, "output_tokens": 0}
    assert events[1][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    deltas = [d for e, d in events if e == "content_block_delta"]
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for d in deltas)
    assert "".join(d["delta"]["text"] for d in deltas) == choice.message.content
    end = events[-2][1]
    assert end["delta"]["stop_reason"] in ("max_tokens", "end_turn") and end["delta"]["stop_sequence"] is None
    assert end["usage"] == {"output_tokens": usage.completion_tokens}
    # The client's own stream helper builds the same message as the request that is not streamed.
    with client.messages.stream(model="tiny", max_tokens=10, messages=MSGS, extra_body=GREEDY) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    whole = client.messages.create(model="tiny", max_tokens=10, messages=MSGS, extra_body=GREEDY)
    assert text == final.content[0].text == whole.content[0].text == choice.message.content
    assert (final.stop_reason, final.usage.output_tokens) == (whole.stop_reason, whole.usage.output_tokens)
    chunks = list(
        client.messages.create(model="tiny", max_tokens=10, messages=MSGS, stream=True, extra_body=GREEDY)
    )
    assert chunks[0].type == "message_start" and chunks[-1].type == "message_stop"


def test_stop_sequences_and_max_tokens(client):
    full = (
        client.messages.create(model="tiny", max_tokens=24, messages=MSGS, extra_body=GREEDY).content[0].text
    )
    stop = full[len(full) // 2 :][:3]
    m = client.messages.create(
        model="tiny", max_tokens=24, messages=MSGS, stop_sequences=["zzzz", stop], extra_body=GREEDY
    )
    assert m.content[0].text == full[: full.index(stop)]
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    with client.messages.stream(
        model="tiny", max_tokens=24, messages=MSGS, stop_sequences=[stop], extra_body=GREEDY
    ) as s:
        final = s.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop
    m = client.messages.create(model="tiny", max_tokens=2, messages=MSGS, extra_body=GREEDY)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 2


def test_sampling_fields_reach_the_sampler(client, tiny_oai):
    greedy = openai_chat(tiny_oai, MSGS)[0].message.content
    # Sampling at temperature 1 that can only pick the most likely token: top_k=1, or a tiny top_p.
    for kw in ({"temperature": 1.0, "top_k": 1}, {"temperature": 1.0, "top_p": 1e-6}):
        m = client.messages.create(model="tiny", max_tokens=10, messages=MSGS, extra_body=kw)
        assert m.content[0].text == greedy, kw


def test_turns_prefill_and_count_tokens(client, tiny_oai, tiny_llm):
    # Consecutive turns of one role are one turn, joined by a blank line.
    two = [
        {"role": "user", "content": "Hello"},
        {"role": "user", "content": [{"type": "text", "text": "there"}]},
    ]
    choice, usage = openai_chat(tiny_oai, [{"role": "user", "content": "Hello\n\nthere"}])
    m = client.messages.create(model="tiny", max_tokens=10, messages=two, extra_body=GREEDY)
    assert m.content[0].text == choice.message.content and m.usage.input_tokens == usage.prompt_tokens
    assert client.messages.count_tokens(model="tiny", messages=two).input_tokens == usage.prompt_tokens
    # A final assistant turn is the start of the reply: the answer continues it.
    prefill = [*MSGS, {"role": "assistant", "content": "Well,"}]
    tpl = ChatTemplate.from_model(tiny_llm.metadata, tiny_llm.tokenizer)
    ids = tpl.encode(tpl.render(MSGS, add_generation_prompt=True) + "Well,")
    assert client.messages.count_tokens(model="tiny", messages=prefill).input_tokens == len(ids)
    m = client.messages.create(model="tiny", max_tokens=10, messages=prefill, extra_body=GREEDY)
    c = tiny_oai.completions.create(
        model="tiny", prompt=ids, max_tokens=10, temperature=0, stop=tpl.stop_strings
    )
    assert m.content[0].text == c.choices[0].text and m.usage.input_tokens == len(ids)
    sys = client.messages.count_tokens(model="tiny", system="Be brief.", messages=MSGS).input_tokens
    assert sys == len(chat_ids(tiny_llm, [{"role": "system", "content": "Be brief."}, *MSGS]))


# ---- errors ------------------------------------------------------------------------------------------


def test_errors_in_anthropics_shape(client, http):
    # One model served: any name is that model (a 404 with several: test_server.py).
    assert client.messages.create(model="claude-nope", max_tokens=1, messages=MSGS).role == "assistant"
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(
            model="tiny",
            max_tokens=5,
            messages=MSGS,
            tools=[{"name": "f", "input_schema": {"type": 3}}],
        )
    assert "tool 'f'" in e.value.body["error"]["message"]
    assert e.value.body["error"]["type"] == "invalid_request_error" and e.value.request_id.startswith("req_")
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(
            model="tiny",
            max_tokens=5,
            messages=MSGS,
            tools=[{"name": "f", "input_schema": {"type": "object"}}],
            tool_choice={"type": "tool", "name": "g"},
        )
    assert "'g' is not in tools" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(
            model="tiny", max_tokens=5, messages=MSGS, thinking={"type": "enabled", "budget_tokens": 1024}
        )
    assert client.messages.count_tokens(model="nope", messages=MSGS).input_tokens > 0

    def post(body: dict, path: str = "/v1/messages") -> httpx.Response:
        return http.post(path, json=body)

    base = {"model": "tiny", "max_tokens": 5, "messages": MSGS}
    invalid = "invalid_request_error"
    assert_anthropic_error(post({"model": "tiny", "messages": MSGS}), 400, invalid, "max_tokens")
    assert_anthropic_error(post({**base, "max_tokens": 0}), 400, invalid, "max_tokens")
    assert_anthropic_error(post({**base, "temperature": 1.5}), 400, invalid, "temperature")
    assert_anthropic_error(post({**base, "messages": []}), 400, invalid, "at least one message")
    assert_anthropic_error(
        post({**base, "frequency_penalty": 1}), 400, invalid, "frequency_penalty"
    )  # unknown: refused
    assert_anthropic_error(
        post({**base, "messages": [{"role": "system", "content": "x"}]}), 400, invalid, "role"
    )
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}}
    assert_anthropic_error(
        post({**base, "messages": [{"role": "user", "content": [image]}]}), 400, invalid, "image"
    )
    bad_block = {"type": "text", "text": "x", "colour": "red"}
    assert_anthropic_error(
        post({**base, "messages": [{"role": "user", "content": [bad_block]}]}), 400, invalid, "colour"
    )
    empty_first = [{"role": "user", "content": ""}, {"role": "assistant", "content": "x"}, *MSGS]
    assert_anthropic_error(post({**base, "messages": empty_first}), 400, invalid, "non-empty")
    trailing = [*MSGS, {"role": "assistant", "content": "Well, "}]
    assert_anthropic_error(post({**base, "messages": trailing}), 400, invalid, "trailing whitespace")
    assert_anthropic_error(
        post({**base, "output_config": {"format": {"type": "yaml"}}}), 400, invalid, "json_schema"
    )
    bad_schema = {"type": "json_schema", "schema": {"type": "integer", "minimum": 3, "maximum": 1}}
    assert_anthropic_error(
        post({**base, "output_config": {"format": bad_schema}}), 400, invalid, "JSON schema"
    )
    assert_anthropic_error(http.post("/v1/messages", content=b"{oops"), 400, invalid, "json")
    web = {"type": "web_search_20250305", "name": "web_search"}
    assert_anthropic_error(post({**base, "tools": [web]}), 400, invalid, "server tools")
    assert_anthropic_error(post({**base, "tool_choice": {"type": "any"}}), 400, invalid, "at least one tool")
    assert_anthropic_error(post({**base, "tool_choice": {"type": "maybe"}}), 400, invalid, "tool_choice.type")
    use = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
    dangling = [*MSGS, {"role": "assistant", "content": [use]}]
    assert_anthropic_error(post({**base, "messages": dangling}), 400, invalid, "tool_result")
    bad_use = [*MSGS, {"role": "assistant", "content": [{**use, "input": "x"}]}, *MSGS]
    assert_anthropic_error(post({**base, "messages": bad_use}), 400, invalid, "input (an object)")
    assert_anthropic_error(
        post(base, "/v1/messages/count_tokens"), 400, invalid, "max_tokens"
    )  # not a field there
    assert_anthropic_error(post({**base, "metadata": {"user": "u1"}}), 400, invalid, "metadata.user")
    # One model served: any name is that model (a 404 with several: test_server.py).
    assert post({**base, "model": "nope", "max_tokens": 1}).status_code == 200
    # Fields Anthropic knows that change nothing here are accepted.
    ok = post(
        {
            **base,
            "metadata": {"user_id": "u1"},
            "service_tier": "auto",
            "thinking": {"type": "disabled"},
            "tool_choice": {"type": "none"},
            "tools": [],
        }
    )
    assert ok.status_code == 200, ok.text


def test_guards_answer_in_anthropics_shape(tiny_llm):
    with running_server(tiny_llm, parallel=1, api_key="k", max_body_bytes=4096) as (srv, _sched):
        # The client sends its key as a bearer token; Anthropic's own x-api-key header works too.
        c = anthropic.Anthropic(base_url=srv.url, api_key="k", max_retries=0)
        assert c.messages.count_tokens(model="tiny", messages=MSGS).input_tokens > 0
        r = httpx.post(
            srv.url + "/v1/messages/count_tokens",
            json={"model": "tiny", "messages": MSGS},
            headers={"x-api-key": "k"},
        )
        assert r.status_code == 200
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=srv.url, api_key="wrong", max_retries=0).messages.count_tokens(
                model="tiny", messages=MSGS
            )
        r = httpx.post(srv.url + "/v1/messages", json={"model": "tiny", "max_tokens": 1, "messages": MSGS})
        assert_anthropic_error(r, 401, "authentication_error", "API key")
        big = {"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "x" * 5000}]}
        r = httpx.post(srv.url + "/v1/messages", json=big, headers={"x-api-key": "k"})
        assert_anthropic_error(r, 413, "request_too_large", "larger")


# ---- the real models ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize("model", ["default_model_path", "gemma_model_path"])
def test_real_models_answer_as_the_openai_endpoint(model, request):
    from llamacy import Llama

    tiny_llm = Llama(request.getfixturevalue(model), n_ctx=512, n_threads=2)
    with running_server(tiny_llm, parallel=2) as (srv, _sched):
        c = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=300)
        oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        msgs = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
        want = oai.chat.completions.create(model="tiny", messages=msgs, max_tokens=48, temperature=0)
        m = c.messages.create(model="tiny", max_tokens=48, messages=msgs, extra_body=GREEDY)
        assert m.content[0].text == want.choices[0].message.content
        assert m.usage.output_tokens == want.usage.completion_tokens
        # A short answer ends its turn by itself.
        assert (m.stop_reason == "end_turn") == (want.choices[0].finish_reason == "stop")
        if model == "default_model_path":  # SmolLM2 answers this one and ends its turn (Gemma 3 270M rambles)
            assert m.stop_reason == "end_turn" and "Paris" in m.content[0].text
        with c.messages.stream(model="tiny", max_tokens=48, messages=msgs, extra_body=GREEDY) as s:
            assert "".join(s.text_stream) == m.content[0].text
            assert s.get_final_message().stop_reason == m.stop_reason
        system = "You are a geography teacher."
        want = oai.chat.completions.create(
            model="tiny",
            messages=[{"role": "system", "content": system}, *msgs],
            max_tokens=24,
            temperature=0,
        )
        m = c.messages.create(model="tiny", max_tokens=24, system=system, messages=msgs, extra_body=GREEDY)
        assert m.content[0].text == want.choices[0].message.content


def test_overloaded_and_shutdown(tiny_llm):
    # A scheduler that is not started holds every request in its queue: the next one finds it full.
    with running_server(tiny_llm, start=False, queue_size=1) as (srv, sched):
        streamed: list[str] = []

        def first() -> None:
            body = {"model": "tiny", "max_tokens": 2, "messages": MSGS, "stream": True}
            with httpx.stream("POST", srv.url + "/v1/messages", json=body, timeout=30) as r:
                streamed.append(r.read().decode())

        t = threading.Thread(target=first)
        t.start()
        deadline = time.monotonic() + 10
        while sched.queue_depth < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = httpx.post(srv.url + "/v1/messages", json={"model": "tiny", "max_tokens": 2, "messages": MSGS})
        assert_anthropic_error(r, 529, "overloaded_error", "queue is full")
        sched.shutdown()  # the queued request ends with Anthropic's error event
        t.join(10)
        events = [block.split("\n") for block in streamed[0].split("\n\n") if block]
        assert [e[0] for e in events] == [
            "event: message_start",
            "event: content_block_start",
            "event: ping",
            "event: error",
        ]
        error = json.loads(events[-1][1][len("data: ") :])
        assert error["type"] == "error" and error["error"]["type"] == "overloaded_error"


WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ADD = {
    "name": "add",
    "description": "Add two integers",
    "input_schema": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.mark.slow
@pytest.mark.model
def test_tool_use_with_the_real_model(default_model_path):
    """tool_choice any / tool / auto / none, whole and streamed (the client's stream helper accumulates
    the input_json_delta), and a follow-up turn with the tool_use and its tool_result."""
    import jsonschema

    from llamacy import Llama
    from llamacy.scheduler import Scheduler
    from llamacy.server import ServerSettings, ServerThread, create_app

    tiny_llm = Llama(default_model_path, n_ctx=1024, n_threads=2)
    sched = Scheduler(tiny_llm, n_parallel=2, n_ctx=1024, n_threads=2).start()
    tpl = ChatTemplate.from_model(tiny_llm.metadata, tiny_llm.tokenizer)
    srv = ServerThread(create_app(sched, tpl, ServerSettings(model_name="tiny"))).start()
    try:
        c = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=300)
        kw = {"model": "tiny", "max_tokens": 80, "extra_body": GREEDY}
        schemas = {"get_weather": WEATHER["input_schema"], "add": ADD["input_schema"]}
        for choice in ({"type": "any"}, {"type": "tool", "name": "add"}):
            m = c.messages.create(messages=ASK, tools=[WEATHER, ADD], tool_choice=choice, **kw)
            assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["tool_use"]
            use = m.content[0]
            assert use.id.startswith("toolu_") and isinstance(use.input, dict)
            jsonschema.validate(use.input, schemas[use.name])
            if choice["type"] == "tool":
                assert use.name == "add"
        m = c.messages.create(
            messages=ASK, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}, **kw
        )
        [use] = m.content
        assert use.name == "get_weather" and set(use.input) == {"city"}
        # Streamed: the SDK's accumulator turns the input_json_delta back into the input.
        with c.messages.stream(
            messages=ASK, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}, **kw
        ) as s:
            events = list(s)
            final = s.get_final_message()
        assert final.stop_reason == "tool_use" and [b.type for b in final.content] == ["tool_use"]
        assert final.content[0].name == "get_weather" and final.content[0].input == use.input
        # The input streams as the model writes it: a start, several input_json_deltas, a stop.
        kinds = [e.type for e in events if e.type.startswith("content_block")]
        assert kinds[0] == "content_block_start" and kinds[-1] == "content_block_stop"
        assert set(kinds[1:-1]) == {"content_block_delta"} and len(kinds) > 3
        start = next(e for e in events if e.type == "content_block_start")
        assert start.index == 0 and start.content_block.type == "tool_use" and start.content_block.input == {}
        deltas = [e.delta for e in events if e.type == "content_block_delta"]
        assert {d.type for d in deltas} == {"input_json_delta"}
        assert json.loads("".join(d.partial_json for d in deltas)) == use.input
        # The wire events, exactly.
        r = httpx.post(
            srv.url + "/v1/messages",
            json={"model": "tiny", "max_tokens": 80, "messages": ASK, "tools": [WEATHER], "stream": True,
                  "tool_choice": {"type": "any"}, "temperature": 0},
            timeout=300,
        )  # fmt: skip
        names = [name for name, _ in sse(r)]
        collapsed = [n for i, n in enumerate(names) if n != "content_block_delta" or names[i - 1] != n]
        assert collapsed == [
            "message_start", "ping", "content_block_start", "content_block_delta", "content_block_stop",
            "message_delta", "message_stop",
        ]  # fmt: skip
        assert names.count("content_block_delta") > 1
        # auto: the model decides; none: text. Streamed and whole agree.
        for choice in ({"type": "auto"}, {"type": "none"}):
            m = c.messages.create(messages=ASK, tools=[WEATHER], tool_choice=choice, **kw)
            with c.messages.stream(messages=ASK, tools=[WEATHER], tool_choice=choice, **kw) as s:
                streamed = s.get_final_message()
            assert [b.model_dump() for b in streamed.content if b.type == "text"] == [
                b.model_dump() for b in m.content if b.type == "text"
            ]
            assert streamed.stop_reason == m.stop_reason
            if choice["type"] == "none":
                assert m.stop_reason in ("end_turn", "max_tokens") and m.content[0].text
        # Structured outputs: output_config.format's schema, whole and streamed.
        person = {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 20},
                "age": {"type": "integer", "minimum": 0},
            },
            "required": ["name", "age"],
        }
        fmt = {"output_config": {"format": {"type": "json_schema", "schema": person}}, **GREEDY}
        ask = [{"role": "user", "content": "Describe a person."}]
        m = c.messages.create(model="tiny", max_tokens=80, messages=ask, extra_body=fmt)
        jsonschema.validate(json.loads(m.content[0].text), person)
        with c.messages.stream(model="tiny", max_tokens=80, messages=ask, extra_body=fmt) as s:
            assert "".join(s.text_stream) == m.content[0].text
        # The follow-up turn: the assistant's tool_use blocks as returned, and the tool's result.
        follow = [
            *ASK,
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": '{"temperature": 21, "sky": "sunny"}'}],
            },
        ]  # fmt: skip
        m2 = c.messages.create(messages=follow, tools=[WEATHER], **kw)
        assert m2.content and m2.stop_reason in ("end_turn", "max_tokens", "tool_use")
        # It renders as the OpenAI route renders the same turn with a tool message.
        oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        oai_call = {"id": use.id, "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps(final.content[0].input)}}  # fmt: skip
        want = oai.chat.completions.create(
            model="tiny", max_tokens=80, temperature=0,
            messages=[*ASK, {"role": "assistant", "content": None, "tool_calls": [oai_call]},
                      {"role": "tool", "tool_call_id": use.id, "content": '{"temperature": 21, "sky": "sunny"}'}],
            tools=[{"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                                     "parameters": WEATHER["input_schema"]}}],
        )  # fmt: skip
        assert m2.usage.input_tokens == want.usage.prompt_tokens
        if not want.choices[0].message.tool_calls:
            assert m2.content[0].text == want.choices[0].message.content
        assert c.messages.count_tokens(model="tiny", messages=follow, tools=[WEATHER]).input_tokens == (
            want.usage.prompt_tokens
        )
    finally:
        sched.shutdown()
        srv.stop()
