"""OpenAI's Responses API (/v1/responses) through the official openai client against the real server: plain
and streamed answers (every event type, in order, numbered), input items and instructions, stored
responses (GET, DELETE, previous_response_id reusing the KV cache, counted in /metrics), errors in
OpenAI's shape; with the real model: tools under each tool_choice, a follow-up turn with the tool's
output, text.format json_schema / json_object, and the parse helper."""

from __future__ import annotations

import json
import time

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field

openai = pytest.importorskip("openai")

from llamacy.server.responses_store import ResponseStore, StoredResponse  # noqa: E402

HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture
def http(tiny_server):
    with httpx.Client(base_url=tiny_server.url, timeout=60) as c:
        yield c


def evaluated(http: httpx.Client) -> int:
    """The server's count of prompt tokens evaluated so far (the others were reused from a KV cache)."""
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("llamacy_prompt_tokens_evaluated_total{"):
            return int(line.split()[-1])
    raise AssertionError("no llamacy_prompt_tokens_evaluated_total in /metrics")


def chat_text(client, messages, n: int) -> str:
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=n, temperature=0)
    return r.choices[0].message.content


# ---- the tiny model: shapes, streaming, storage, errors -------------------------------------------------


def test_plain_response_is_the_chat_answer(tiny_oai):
    r = tiny_oai.responses.create(model="gpt-4o", input="Hello", max_output_tokens=6, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny"
    [msg] = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert [p.type for p in msg.content] == ["output_text"] and msg.content[0].annotations == []
    assert r.output_text == chat_text(tiny_oai, HELLO, 6)  # the same prompt and greedy decoding
    # A random model does not stop by itself: cut short by max_output_tokens.
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert msg.status == "incomplete"
    u = r.usage
    assert u.output_tokens == 6 and u.total_tokens == u.input_tokens + 6
    assert u.input_tokens_details.cached_tokens + u.input_tokens_details.cache_write_tokens == u.input_tokens
    assert u.output_tokens_details.reasoning_tokens == 0
    assert r.max_output_tokens == 6 and r.temperature == 0 and r.tool_choice == "auto" and r.tools == []
    assert r.parallel_tool_calls is True and r.text.format.type == "text"


def test_input_items_and_instructions(tiny_oai):
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Hel"}, {"type": "input_text", "text": "lo"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi."}]},
        {"type": "message", "role": "user", "content": "Weather?"},
    ]  # fmt: skip
    r = tiny_oai.responses.create(
        model="tiny", input=items, instructions="Be brief.", max_output_tokens=5, temperature=0
    )
    messages = [{"role": "system", "content": "Be brief."}, *HELLO, {"role": "assistant", "content": "Hi."},
                {"role": "user", "content": "Weather?"}]  # fmt: skip
    assert r.output_text == chat_text(tiny_oai, messages, 5)
    assert r.instructions == "Be brief."
    # An earlier call and its output as items: the prompt the chat route makes of tool_calls + a tool message.
    call = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": '{"x": 1}'}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "42"}
    r = tiny_oai.responses.create(
        model="tiny", input=[*items[:1], call, output], max_output_tokens=5, temperature=0
    )
    tool_calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]
    messages = [*HELLO, {"role": "assistant", "content": "", "tool_calls": tool_calls},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"}]  # fmt: skip
    assert r.output_text == chat_text(tiny_oai, messages, 5)


EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",  # one or more: a piece of text per token or few (whole characters)
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.incomplete",
]


def test_streamed_events_in_order(tiny_oai, http):
    body = {"model": "tiny", "input": "Hello", "max_output_tokens": 7, "temperature": 0, "stream": True}
    with http.stream("POST", "/v1/responses", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = list(r.iter_lines())
    events = sse_events_typed(lines)
    kinds = [e["type"] for e in events]
    assert [
        k for i, k in enumerate(kinds) if k != kinds[i - 1] or k != "response.output_text.delta"
    ] == EVENTS
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    whole = tiny_oai.responses.create(model="tiny", input="Hello", max_output_tokens=7, temperature=0)
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == events[-4]["text"] == whole.output_text
    item_id = events[2]["item"]["id"]
    assert all(e["item_id"] == item_id for e in events[3:-2]) and events[-2]["item"]["id"] == item_id
    final = events[-1]["response"]
    assert final["id"] == events[0]["response"]["id"] and final["status"] == "incomplete"
    assert final["usage"]["output_tokens"] == 7 and final["output"][0]["content"][0]["text"] == deltas
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    # The client's typed stream reads the same events.
    with tiny_oai.responses.stream(model="tiny", input="Hello", max_output_tokens=7, temperature=0) as s:
        typed = list(s)
    assert [e.type for e in typed] == kinds
    assert "".join(e.delta for e in typed if e.type == "response.output_text.delta") == deltas


def sse_events_typed(lines: list[str]) -> list[dict]:
    """Each `event: T` line followed by its `data:` whose type is T."""
    out, kind = [], None
    for line in lines:
        if line.startswith("event: "):
            kind = line[len("event: ") :]
        elif line.startswith("data: "):
            obj = json.loads(line[len("data: ") :])
            assert obj["type"] == kind, (kind, obj)
            out.append(obj)
    return out


def test_previous_response_id_evaluates_only_the_new_tokens(tiny_oai, http):
    first = tiny_oai.responses.create(
        model="tiny", input="Tell me a story", max_output_tokens=8, temperature=0
    )
    before = evaluated(http)
    second = tiny_oai.responses.create(
        model="tiny", input="And then?", previous_response_id=first.id, max_output_tokens=4, temperature=0
    )
    new = evaluated(http) - before
    u1, u2 = first.usage, second.usage
    # The first turn's prompt and reply are in a slot's cache, all but the reply's last token (sampled,
    # never fed through the model): the second turn evaluates the rest and nothing else.
    assert u2.input_tokens_details.cached_tokens == u1.input_tokens + u1.output_tokens - 1
    assert new == u2.input_tokens - u2.input_tokens_details.cached_tokens
    assert new < u2.input_tokens - u1.input_tokens
    assert second.previous_response_id == first.id


def test_stored_responses_get_and_delete(tiny_oai, http):
    r = tiny_oai.responses.create(model="tiny", input="Hello", max_output_tokens=3, temperature=0)
    got = tiny_oai.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.usage == r.usage
    assert http.delete(f"/v1/responses/{r.id}").json() == {"id": r.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError) as e:
        tiny_oai.responses.retrieve(r.id)
    assert e.value.body["code"] == "response_not_found"
    assert http.delete(f"/v1/responses/{r.id}").status_code == 404
    unstored = tiny_oai.responses.create(model="tiny", input="Hello", max_output_tokens=3, store=False)
    assert http.get(f"/v1/responses/{unstored.id}").status_code == 404
    with pytest.raises(openai.NotFoundError) as e:
        tiny_oai.responses.create(model="tiny", input="x", previous_response_id=unstored.id)
    assert e.value.body["param"] == "previous_response_id"


def test_a_conversation_continued_on_another_model(tiny_gguf, tmp_path):
    """Token ids belong to the model that made them: a response continued by another model is re-encoded
    (the answer is the chat route's for the same history); with several models an unknown name is a 404."""
    from llamacy.server import ModelRegistry, ServerThread, create_app
    from llamacy.server.loading import ModelLoader
    from llamacy.server.models import ModelSpec
    from tests.model_factory import write_tiny_model

    other = write_tiny_model(tmp_path / "other.gguf", seed=3)
    specs = [ModelSpec("a", str(tiny_gguf)), ModelSpec("b", str(other))]
    registry = ModelRegistry(specs, ModelLoader(n_ctx=128, n_threads=1, n_parallel=1, queue_size=4))
    try:
        with ServerThread(create_app(registry)) as srv:
            c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
            first = c.responses.create(model="a", input="Hello", max_output_tokens=4, temperature=0)
            second = c.responses.create(
                model="b", input="More", previous_response_id=first.id, max_output_tokens=4, temperature=0
            )
            assert second.model == "b" and second.usage.input_tokens_details.cached_tokens == 0
            history = [
                *HELLO,
                {"role": "assistant", "content": first.output_text},
                {"role": "user", "content": "More"},
            ]
            chat = c.chat.completions.create(model="b", messages=history, max_tokens=4, temperature=0)
            assert second.output_text == chat.choices[0].message.content
            with pytest.raises(openai.NotFoundError) as e:
                c.responses.create(model="nope", input="x")
            assert "known models: a, b" in e.value.body["message"]
    finally:
        registry.close()


def test_a_failure_mid_stream_is_response_failed(tiny_llm):
    """The scheduler stops while a response streams: the stream ends with response.failed and the error;
    a response not streamed gets a 503 in OpenAI's shape."""
    import threading

    from tests.test_server import SlowScheduler, running_server

    with running_server(tiny_llm, SlowScheduler, parallel=1) as (srv, sched):
        body = {"input": "Hello", "max_output_tokens": 100, "ignore_eos": True, "stream": True}
        kinds, last = [], None
        with httpx.stream("POST", srv.url + "/v1/responses", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                last = json.loads(line[len("data: ") :])
                kinds.append(last["type"])
                if kinds.count("response.output_text.delta") == 1:
                    threading.Thread(target=sched.shutdown).start()
        assert kinds[-1] == "response.failed" and "response.completed" not in kinds
        assert last["response"]["status"] == "failed" and last["response"]["error"]["code"] == "server_error"
        r = httpx.post(srv.url + "/v1/responses", json={"input": "Hello", "max_output_tokens": 2}, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"


def test_response_store_is_bounded_and_expires():
    store = ResponseStore(max_items=2, ttl_s=0.2)
    for rid in ("a", "b", "c"):
        store.put(rid, StoredResponse(body={"id": rid}, messages=[]))
    assert store.get("a") is None and store.get("b") is not None and len(store) == 2
    time.sleep(0.25)
    assert store.get("c") is None and len(store) == 0


@pytest.mark.parametrize(
    ("body", "status", "fragment", "param"),
    [
        ({"input": [{"type": "input_image", "image_url": "x"}]}, 400, "not supported", "input[0].type"),
        ({"input": [{"type": "function_call", "name": "f"}]}, 400, "call_id", "input[0]"),
        ({"input": [{"role": "robot", "content": "x"}]}, 400, "role", "input[0]"),
        ({"input": ["x"]}, 400, "an item must be an object", "input[0]"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, 400, "only function tools", "tools"),
        ({"input": "x", "tool_choice": {"type": "file_search"}}, 400, "tool_choice", "tool_choice"),
        ({"input": "x", "text": {"format": {"type": "yaml"}}}, 400, "text.format.type", "text.format"),
        ({"input": "x", "max_output_tokens": 0}, 400, "max_output_tokens", "max_output_tokens"),
        ({"input": "x", "max_tokens": 5}, 400, "max_output_tokens", "max_tokens"),
        ({"input": "x", "background": True}, 400, "background", "background"),
        ({"input": 5}, 400, "input", "input"),
        ({"input": []}, 400, "must not be empty", "input"),
        ({}, 400, "missing required field: input", "input"),
        ({"input": "x", "previous_response_id": "resp_nope"}, 404, "resp_nope", "previous_response_id"),
    ],
)  # fmt: skip
def test_errors_in_openais_shape(http, body, status, fragment, param):
    r = http.post("/v1/responses", json={"model": "tiny", **body})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and fragment in err["message"], err
    assert err["param"] == param
    r = http.post("/v1/responses", content=b"{not json")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    assert http.get("/v1/responses/resp_nope").status_code == 404


# ---- the real model: tools, structured output --------------------------------------------------------

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"],
    },
}  # fmt: skip
ADD = {
    "type": "function",
    "name": "add",
    "description": "Add two integers",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}
ASK = "What is the weather like in Paris today?"


@pytest.fixture(scope="module")
def real(default_model_path):
    from llamacy import Llama
    from llamacy.chat_template import ChatTemplate
    from llamacy.scheduler import Scheduler
    from llamacy.server import ServerSettings, ServerThread, create_app

    llm = Llama(default_model_path, n_ctx=1024, n_threads=2)
    sched = Scheduler(llm, n_parallel=2, n_ctx=1024, n_threads=2).start()
    tpl = ChatTemplate.from_model(llm.metadata, llm.tokenizer)
    srv = ServerThread(create_app(sched, tpl, ServerSettings(model_name="smollm2"))).start()
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)
    sched.shutdown()
    srv.stop()


def _calls(r) -> list:
    return [item for item in r.output if item.type == "function_call"]


@pytest.mark.slow
def test_tool_choice_required_named_auto_none(real):
    schemas = {"get_weather": WEATHER["parameters"], "add": ADD["parameters"]}
    for choice in (
        "required",
        {"type": "function", "name": "get_weather"},
        {"type": "function", "name": "add"},
    ):
        r = real.responses.create(
            model="smollm2", input=ASK, tools=[WEATHER, ADD], tool_choice=choice, max_output_tokens=80, temperature=0
        )  # fmt: skip
        assert r.status == "completed" and r.output_text == ""
        [call] = _calls(r)
        assert call.id.startswith("fc_") and call.call_id.startswith("call_") and call.status == "completed"
        jsonschema.validate(json.loads(call.arguments), schemas[call.name])
        if isinstance(choice, dict):
            assert call.name == choice["name"]
    r = real.responses.create(
        model="smollm2", input=ASK, tools=[WEATHER], tool_choice="none", max_output_tokens=30, temperature=0
    )
    assert _calls(r) == [] and r.output_text
    r = real.responses.create(
        model="smollm2", input="Say hello.", tools=[WEATHER], tool_choice="auto", max_output_tokens=40, temperature=0
    )  # fmt: skip
    assert _calls(r) or r.output_text  # the model decides; either way the reply is parsed
    r = real.responses.create(
        model="smollm2", input=ASK, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
        max_output_tokens=120, temperature=0,
    )  # fmt: skip
    assert len(_calls(r)) == 1 and r.parallel_tool_calls is False


@pytest.mark.slow
def test_tool_call_streamed_and_follow_up_turn(real):
    kw = {"model": "smollm2", "tools": [WEATHER], "max_output_tokens": 80, "temperature": 0}
    whole = real.responses.create(input=ASK, tool_choice="required", **kw)
    [call] = _calls(whole)
    with real.responses.stream(input=ASK, tool_choice="required", **kw) as s:
        events = list(s)
        final = s.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.output_text.delta" not in kinds  # a forced call: no text
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call" and added.item.name == "get_weather"
    streamed = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert streamed == done.arguments == call.arguments == _calls(final)[0].arguments
    # The follow-up: the tool's output by previous_response_id, and the same with the history as items.
    output = {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": 21}'}
    kw["max_output_tokens"] = 40
    by_id = real.responses.create(input=[output], previous_response_id=whole.id, **kw)
    assert by_id.output_text or _calls(by_id)
    history = [{"role": "user", "content": ASK}, call.model_dump(exclude_none=True), output]
    by_items = real.responses.create(input=history, **kw)
    assert by_items.output_text == by_id.output_text


class Weather(BaseModel):
    city: str = Field(max_length=30)
    celsius: int = Field(ge=-50, le=60)


@pytest.mark.slow
def test_text_format_json_schema_and_parse(real):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
        "required": ["name", "age"],
    }  # fmt: skip
    fmt = {"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}}
    r = real.responses.create(
        model="smollm2", input="Invent a person.", text=fmt, max_output_tokens=60, temperature=0
    )
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema" and r.text.format.name == "person"
    r = real.responses.create(
        model="smollm2", input="A JSON object about Paris.", text={"format": {"type": "json_object"}},
        max_output_tokens=60, temperature=0.7, top_p=0.9, extra_body={"seed": 1},
    )  # fmt: skip
    if r.status == "completed":
        assert isinstance(json.loads(r.output_text), dict)
    parsed = real.responses.parse(
        model="smollm2",
        input="The weather in Rome.",
        text_format=Weather,
        max_output_tokens=60,
        temperature=0,
    )
    assert isinstance(parsed.output_parsed, Weather)
