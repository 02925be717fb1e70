"""Structured output through the real server with the real model, driven by the official openai client:
response_format (json_object, json_schema with diverse schemas, the Pydantic parse helper), tools with every
tool_choice, streamed and not, a follow-up turn with the tool's result, llama.cpp's grammar / json_schema
fields on /v1/completions, and bad schemas and grammars."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field

openai = pytest.importorskip("openai")

from llamacy.chat_template import ChatTemplate  # noqa: E402
from llamacy.scheduler import Scheduler  # noqa: E402
from llamacy.server import ServerSettings, ServerThread, create_app  # noqa: E402

pytestmark = pytest.mark.slow

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 30}, "email": {"type": "string", "maxLength": 40}},
                "required": ["name", "email"],
            },
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
    },
    "enum": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"type": "string", "enum": ["S", "M", "L"]}},
        "required": ["color", "size"],
    },
    "array_bounds": {
        "type": "object",
        "properties": {"fruits": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 2, "maxItems": 4}},
        "required": ["fruits"],
    },
    "integer_bounds": {
        "type": "object",
        "properties": {"year": {"type": "integer", "minimum": 1900, "maximum": 2100}, "month": {"type": "integer", "minimum": 1, "maximum": 12}},
        "required": ["year", "month"],
    },
    "pattern": {
        "type": "object",
        "properties": {"phone": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"}, "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"}},
        "required": ["phone", "code"],
    },
    "optional": {
        "type": "object",
        "properties": {"title": {"type": "string", "maxLength": 40}, "subtitle": {"type": "string", "maxLength": 40}, "pages": {"type": "integer", "minimum": 1}},
        "required": ["title"],
    },
    "any_of": {
        "type": "object",
        "properties": {"value": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 10}, {"type": "null"}]}},
        "required": ["value"],
    },
    "array_of_objects": {
        "type": "array",
        "items": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"]},
        "minItems": 1,
        "maxItems": 3,
    },
}  # fmt: skip

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def server(default_model_path):
    from llamacy import Llama

    llm = Llama(default_model_path, n_ctx=1024, n_threads=2)
    sched = Scheduler(llm, n_parallel=4, n_ctx=1024, n_threads=2).start()
    tpl = ChatTemplate.from_model(llm.metadata, llm.tokenizer)
    srv = ServerThread(create_app(sched, tpl, ServerSettings(model_name="smollm2"))).start()
    yield srv
    sched.shutdown()
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)


def _schema_format(name: str, schema: dict, strict: bool = True) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": strict}}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_diverse_schemas_validate(client, name):
    schema = SCHEMAS[name]
    messages = [{"role": "user", "content": f"Give an example JSON value ({name.replace('_', ' ')})."}]
    r = client.chat.completions.create(
        model="smollm2",
        messages=messages,
        max_tokens=300,
        temperature=0,
        response_format=_schema_format(name, schema),
    )
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content), schema)  # bare JSON: no fences, no prose


def test_schema_streamed_sampled_and_several_choices(client):
    schema = SCHEMAS["integer_bounds"]
    stream = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "A date"}], max_tokens=100, temperature=0.9,
        seed=3, n=3, stream=True, response_format=_schema_format("d", schema),
    )  # fmt: skip
    texts = ["", "", ""]
    finishes = [None, None, None]
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            finishes[c.index] = c.finish_reason or finishes[c.index]
    assert finishes == ["stop"] * 3
    for t in texts:
        jsonschema.validate(json.loads(t), schema)


def test_json_object_mode_and_completions_endpoint(client):
    r = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Give me a JSON with a name and age of a person"}], max_tokens=150,
        temperature=0, response_format={"type": "json_object"},
    )  # fmt: skip
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    schema = SCHEMAS["enum"]
    r = client.completions.create(
        model="smollm2", prompt="A T-shirt as JSON:", max_tokens=60, temperature=0,
        extra_body={"response_format": _schema_format("shirt", schema)},
    )  # fmt: skip
    jsonschema.validate(json.loads(r.choices[0].text), schema)
    r = client.completions.create(
        model="smollm2",
        prompt="A T-shirt as JSON:",
        max_tokens=60,
        temperature=0,
        extra_body={"json_schema": schema},
    )
    jsonschema.validate(json.loads(r.choices[0].text), schema)


class Address(BaseModel):
    street: str = Field(max_length=40)
    city: str = Field(max_length=30)


class Person(BaseModel):
    name: str = Field(max_length=30)
    age: int
    role: Literal["admin", "user", "guest"]
    address: Address
    nickname: str | None = None


def test_pydantic_parse_helper(client):
    r = client.chat.completions.parse(
        model="smollm2", messages=[{"role": "user", "content": "Invent a person."}], max_tokens=200,
        temperature=0, response_format=Person,
    )  # fmt: skip
    person = r.choices[0].message.parsed
    assert isinstance(person, Person) and isinstance(person.address, Address)


def test_gbnf_grammars_on_completions(client):
    grammar = 'root ::= answer "."\nanswer ::= "yes" | "no" | "maybe"'
    r = client.completions.create(
        model="smollm2",
        prompt="Is the sky blue? Answer: ",
        max_tokens=10,
        temperature=0,
        extra_body={"grammar": grammar},
    )
    assert r.choices[0].text in ("yes.", "no.", "maybe.") and r.choices[0].finish_reason == "stop"
    arith = 'root ::= num " + " num " = " num\nnum ::= [1-9] [0-9]{0,2}'
    r = client.completions.create(
        model="smollm2",
        prompt="An addition: ",
        max_tokens=20,
        temperature=0.8,
        seed=1,
        extra_body={"grammar": arith},
    )
    import re

    assert re.fullmatch(r"[1-9][0-9]{0,2} \+ [1-9][0-9]{0,2} = [1-9][0-9]{0,2}", r.choices[0].text)
    # Streamed, and a grammar that never ends is bounded by max_tokens.
    chunks = list(client.completions.create(
        model="smollm2", prompt="Letters: ", max_tokens=8, temperature=0, stream=True,
        extra_body={"grammar": 'root ::= [a-z]+ "!"'},
    ))  # fmt: skip
    assert chunks[-1].choices[0].finish_reason == "length"
    assert re.fullmatch("[a-z]*", "".join(c.choices[0].text for c in chunks))


def _calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def test_tool_choice_required_and_named(client):
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = client.chat.completions.create(
            model="smollm2",
            messages=ASK,
            tools=[WEATHER, ADD],
            tool_choice=choice,
            max_tokens=80,
            temperature=0,
        )
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.content is None
        [(name, args)] = _calls(c.message)
        assert c.message.tool_calls[0].id and c.message.tool_calls[0].type == "function"
        jsonschema.validate(args, {"get_weather": WEATHER, "add": ADD}[name]["function"]["parameters"])
        if isinstance(choice, dict):
            assert name == "get_weather"
    r = client.chat.completions.create(
        model="smollm2", messages=ASK, tools=[WEATHER, ADD], max_tokens=80, temperature=0,
        tool_choice={"type": "function", "function": {"name": "add"}},
    )  # fmt: skip
    [(name, args)] = _calls(r.choices[0].message)
    assert name == "add" and set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values())


def test_tool_calls_streamed(client):
    stream = client.chat.completions.create(
        model="smollm2",
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=80,
        temperature=0,
        stream=True,
    )
    content, calls, finish = "", {}, None
    for chunk in stream:
        d = chunk.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            entry = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
            entry["name"] += tc.function.name or ""
            entry["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert content == "" and finish == "tool_calls"
    assert [c["name"] for c in calls.values()] == ["get_weather"] and calls[0]["id"].startswith("call_")
    assert "city" in json.loads(calls[0]["arguments"])
    # The SDK's own stream accumulator understands the chunks.
    with client.chat.completions.stream(
        model="smollm2", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=80, temperature=0
    ) as s:
        final = s.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_tool_choice_auto_and_none(client):
    # "auto": the model decides; the reply is parsed either way, and is text or calls, never both garbled.
    r = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Say hello."}], tools=[WEATHER], tool_choice="auto",
        max_tokens=40, temperature=0,
    )  # fmt: skip
    c = r.choices[0]
    if c.message.tool_calls:
        assert c.finish_reason == "tool_calls"
    else:
        assert c.message.content and c.finish_reason in ("stop", "length")
    stream = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Say hello."}], tools=[WEATHER], max_tokens=40,
        temperature=0, stream=True,
    )  # fmt: skip
    text = "".join(ch.choices[0].delta.content or "" for ch in stream)
    assert text == (c.message.content or "")  # streamed and whole agree
    r = client.chat.completions.create(
        model="smollm2", messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=30, temperature=0
    )
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content


def test_follow_up_turn_with_tool_result(client):
    r = client.chat.completions.create(
        model="smollm2", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=80, temperature=0
    )
    call = r.choices[0].message.tool_calls[0]
    messages = [
        *ASK,
        r.choices[0].message.model_dump(
            exclude_none=True
        ),  # the assistant turn with its tool_calls, as sent back
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "sunny"})},
    ]
    r2 = client.chat.completions.create(
        model="smollm2", messages=messages, tools=[WEATHER], max_tokens=60, temperature=0
    )
    c = r2.choices[0]
    assert c.finish_reason in ("stop", "length", "tool_calls")
    assert c.message.content or c.message.tool_calls
    # The same turn answered in a JSON shape.
    r3 = client.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=60, temperature=0,
        response_format=_schema_format("w", {"type": "object", "properties": {"summary": {"type": "string", "maxLength": 80}}, "required": ["summary"]}),
    )  # fmt: skip
    assert "summary" in json.loads(r3.choices[0].message.content)


@pytest.mark.parametrize(
    ("path", "body", "fragment", "param"),
    [
        ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}}, "Invalid type: objekt", "response_format"),
        ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}}, "Unimplemented keys", "response_format"),
        ("/v1/chat/completions", {"response_format": {"type": "yaml"}}, "response_format.type", "response_format"),
        ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, "json_schema must be an object", "response_format"),
        ("/v1/chat/completions", {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not in tools", "tool_choice"),
        ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]}, "parameters schema of tool 'f'", "tools"),
        ("/v1/chat/completions", {"tool_choice": "required"}, "needs at least one tool", "tool_choice"),
        ("/v1/completions", {"grammar": 'root ::= "a" | b'}, "Rule 'b' not found", "grammar"),
        ("/v1/completions", {"grammar": 'root ::= ("a"'}, "invalid grammar", "grammar"),
        ("/v1/completions", {"json_schema": {"type": "integer", "minimum": 3, "maximum": 1}}, "Unsatisfiable", "json_schema"),
        ("/v1/completions", {"grammar": 'root ::= "a"', "json_schema": {}}, "only one of", "grammar"),
        ("/v1/completions", {"grammar": "root ::= x\nx ::= x"}, "nothing can be generated", "grammar"),
    ],
)  # fmt: skip
def test_bad_schemas_and_grammars_are_400(server, path, body, fragment, param):
    base = {"messages": [{"role": "user", "content": "x"}]} if "chat" in path else {"prompt": "x"}
    r = httpx.post(server.url + path, json={**base, **body, "max_tokens": 5}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert fragment in err["message"] and "\n" not in err["message"]
    assert err["type"] == "invalid_request_error" and err["param"] == param


def test_bad_schema_through_the_client(client):
    with pytest.raises(openai.BadRequestError, match="Invalid type"):
        client.chat.completions.create(
            model="smollm2",
            messages=ASK,
            max_tokens=5,
            response_format=_schema_format("x", {"type": "objekt"}),
        )
