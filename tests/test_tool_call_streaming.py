"""A tool call's arguments stream in pieces as the model writes them, on every dialect that streams them
(OpenAI chat, Anthropic messages, the Responses API, and the Python API's OpenAI chunks), and the pieces
joined equal the arguments of the same request answered whole. The real model, greedy, a forced call."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

pytestmark = pytest.mark.slow

PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
CHAT_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": PARAMETERS},
}
ASK = "What is the weather like in Paris today, in celsius?"
MESSAGES = [{"role": "user", "content": ASK}]
FORCED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def llm(default_model_path):
    from llamacy import Llama

    return Llama(default_model_path, n_ctx=1024, n_threads=2)


@pytest.fixture(scope="module")
def url(llm):
    from llamacy.chat_template import ChatTemplate
    from llamacy.scheduler import Scheduler
    from llamacy.server import ServerSettings, ServerThread, create_app

    sched = Scheduler(llm, n_parallel=2, n_ctx=1024, n_threads=2).start()
    tpl = ChatTemplate.from_model(llm.metadata, llm.tokenizer)
    srv = ServerThread(create_app(sched, tpl, ServerSettings(model_name="smollm2"))).start()
    yield srv.url
    sched.shutdown()
    srv.stop()


def test_openai_chat(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
    kw = {"model": "smollm2", "messages": MESSAGES, "tools": [CHAT_TOOL], "tool_choice": FORCED}
    whole = client.chat.completions.create(**kw, max_tokens=80, temperature=0)
    [call] = whole.choices[0].message.tool_calls
    pieces, ids = [], []
    for chunk in client.chat.completions.create(**kw, max_tokens=80, temperature=0, stream=True):
        for tc in chunk.choices[0].delta.tool_calls or []:
            assert tc.index == 0
            ids += [tc.id] if tc.id else []
            pieces.append(tc.function.arguments or "")
    assert len([p for p in pieces if p]) > 1
    assert "".join(pieces) == call.function.arguments and len(ids) == 1
    assert set(json.loads(call.function.arguments)) == {"city", "unit"}


def test_anthropic_messages(url):
    client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=300)
    tool = {"name": "get_weather", "description": "Current weather in a city", "input_schema": PARAMETERS}
    kw = {
        "model": "smollm2",
        "max_tokens": 80,
        "messages": MESSAGES,
        "tools": [tool],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "extra_body": {"temperature": 0},
    }
    whole = client.messages.create(**kw)
    [use] = whole.content
    with client.messages.stream(**kw) as s:
        events = list(s)
    pieces = [e.delta.partial_json for e in events if e.type == "content_block_delta"]
    assert len(pieces) > 1
    assert json.loads("".join(pieces)) == use.input
    # The same text as the OpenAI route's arguments: Anthropic's wire sends that text in pieces.
    oai = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
    r = oai.chat.completions.create(
        model="smollm2",
        messages=MESSAGES,
        tools=[CHAT_TOOL],
        tool_choice=FORCED,
        max_tokens=80,
        temperature=0,
    )
    assert "".join(pieces) == r.choices[0].message.tool_calls[0].function.arguments


def test_responses(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
    tool = {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather",
        "parameters": PARAMETERS,
    }
    kw = {
        "model": "smollm2",
        "input": ASK,
        "tools": [tool],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 80,
        "temperature": 0,
    }
    whole = client.responses.create(**kw)
    [call] = [item for item in whole.output if item.type == "function_call"]
    with client.responses.stream(**kw) as s:
        events = list(s)
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(pieces) > 1
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert "".join(pieces) == done.arguments == call.arguments


def test_python_api(llm):
    kw = {"tools": [CHAT_TOOL], "tool_choice": FORCED, "max_tokens": 80, "temperature": 0}
    whole = llm.create_chat_completion(MESSAGES, **kw)
    [call] = whole["choices"][0]["message"]["tool_calls"]
    pieces = [
        tc["function"].get("arguments", "")
        for chunk in llm.create_chat_completion(MESSAGES, stream=True, **kw)
        for tc in chunk["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert len([p for p in pieces if p]) > 1
    assert "".join(pieces) == call["function"]["arguments"]
