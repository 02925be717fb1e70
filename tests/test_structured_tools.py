"""Tool calls without a server: definitions and tool_choice checks, the prompt (built-in and through a template
that knows tools), the grammar of a forced call with the real model, and parsing replies whole and streamed."""

from __future__ import annotations

import json

import pytest

from llamacy.chat_template import ChatTemplate
from llamacy.errors import UsageError
from llamacy.gguf import GGUFFile
from llamacy.structured import (
    Constraint,
    StructuredRequest,
    ToolCallStream,
    ToolPlan,
    parse_tool_calls,
    tool_call_deltas,
)
from llamacy.tokenizer import Tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
TOOLS = [WEATHER, ADD]
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
]  # fmt: skip


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model(request, default_model_path, gemma_model_path):
    path = default_model_path if request.param == "smollm2" else gemma_model_path
    meta = GGUFFile(path).metadata
    tok = Tokenizer.from_metadata(meta)
    return tok, ChatTemplate.from_model(meta, tok)


@pytest.mark.parametrize(
    ("tools", "choice", "parallel", "message"),
    [
        ("x", None, None, "tools must be a list"),
        ([{"type": "function"}], None, None, "tools[0] must be"),
        ([{"type": "function", "function": {"name": "a b"}}], None, None, "function.name"),
        ([WEATHER, WEATHER], None, None, "two tools are named 'get_weather'"),
        ([{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}], None, None,
         "parameters schema of tool 'f'"),
        (TOOLS, "sometimes", None, "tool_choice must be"),
        (TOOLS, {"type": "function", "function": {"name": "nope"}}, None, "'nope', which is not in tools"),
        ([], "required", None, "needs at least one tool"),
        (TOOLS, "auto", "yes", "parallel_tool_calls must be a boolean"),
    ],
)  # fmt: skip
def test_bad_tools_are_usage_errors(tools, choice, parallel, message):
    with pytest.raises(UsageError) as e:
        ToolPlan.from_request(tools, choice, parallel)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_plan_modes():
    assert ToolPlan.from_request(None).choice == "none" and not ToolPlan.from_request(None).active
    auto = ToolPlan.from_request(TOOLS)
    assert auto.choice == "auto" and auto.active and not auto.forced and auto.max_calls is None
    assert ToolPlan.from_request(TOOLS, "auto", False).max_calls == 1
    named = ToolPlan.from_request(TOOLS, {"type": "function", "function": {"name": "add"}})
    assert named.forced and [t.name for t in named.offered()] == ["add"]
    assert not ToolPlan.from_request(TOOLS, "none").active


def test_builtin_prompt_and_history(model):
    _, tpl = model
    plan = ToolPlan.from_request(TOOLS)
    text = plan.render(tpl, HISTORY, add_generation_prompt=True)
    assert '"name": "get_weather"' in text and "<tool_call>" in text  # the tools and the format
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text  # the earlier call
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in text  # its result
    none = ToolPlan.from_request(TOOLS, "none").render(tpl, HISTORY[:1], add_generation_prompt=True)
    assert "<tools>" not in none


def test_template_that_knows_tools_gets_them(model):
    tok, _ = model
    source = (
        "{% for t in tools %}TOOL {{ t.function.name }}\n{% endfor %}"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}"
        "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} {{ c.function.arguments.city }}{% endfor %}\n"
        "{% endfor %}"
    )
    tpl = ChatTemplate(source, tok, name="test")
    plan = ToolPlan.from_request(TOOLS)
    text = plan.render(tpl, HISTORY, add_generation_prompt=True)
    assert "TOOL get_weather\nTOOL add\n" in text
    assert "CALL get_weather Paris" in text  # arguments reach the template as an object
    assert "tool: 18 C, sunny" in text
    assert not plan.wrapped(tpl)  # no <tool_call> in the template: calls are bare JSON


@pytest.mark.slow
def test_forced_call_grammar(model):
    tok, tpl = model
    plan = ToolPlan.from_request(TOOLS, "required", False)
    c = Constraint(plan.grammar(tpl), tok)
    assert tok.decode(c.forced()).startswith("<tool_call>")  # a call from the first token
    c = Constraint(plan.grammar(tpl), tok)
    good = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    c.accept_all(tok.encode(good))
    assert c.done  # one call only: parallel_tool_calls false
    c = Constraint(plan.grammar(tpl), tok)
    bad = tok.encode('<tool_call>\n{"name": "add", "arguments": {"a": 1}}')
    assert c.valid_prefix(bad) < len(bad)  # b is required
    assert ToolPlan.from_request(TOOLS, "auto").grammar(tpl) is None


def test_parse_replies():
    names = ["get_weather", "add"]
    content, calls = parse_tool_calls("It is sunny.", names)
    assert content == "It is sunny." and calls == []
    content, calls = parse_tool_calls(
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}', names
    )  # fmt: skip
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "add"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["id"] != calls[1]["id"]
    content, calls = parse_tool_calls('```json\n{"name": "add", "parameters": {"a": 1, "b": 2}}\n```', names)
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    # Unknown functions and broken JSON stay text.
    text = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    assert parse_tool_calls(text, names) == (text, [])
    assert parse_tool_calls('{"name": "add", "arguments": ', names)[1] == []


@pytest.mark.parametrize("split", [1, 3, 7])
def test_stream_holds_back_calls(split):
    text = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    s = ToolCallStream(["add"])
    shown = "".join(s.feed(text[i : i + split]) for i in range(0, len(text), split))
    rest, calls = s.finish()
    assert "<" not in shown and shown.strip() == "Sure."
    assert rest == "" and [c["function"]["name"] for c in calls] == ["add"]
    # Plain text streams as it comes (a "<" that is not a marker is released once that is clear).
    s = ToolCallStream(["add"])
    text = "a < b and <b> is bold"
    shown = "".join(s.feed(text[i : i + split]) for i in range(0, len(text), split))
    rest, calls = s.finish()
    assert shown + rest == text and calls == []
    # A reply that starts like JSON is held to the end, and is content if it is not a call.
    s = ToolCallStream(["add"])
    assert s.feed('{"x": 1}') == "" and s.finish() == ('{"x": 1}', [])


def test_structured_request(model):
    tok, tpl = model
    s = StructuredRequest.from_request(tpl, response_format={"type": "json_object"})
    assert s.constrained and not s.tools.active and s.stream() is None
    assert s.reply('{"a": 1}', "stop") == ('{"a": 1}', [], "stop")
    # A forced call takes the call's grammar over response_format.
    s = StructuredRequest.from_request(
        tpl, response_format={"type": "json_object"}, tools=TOOLS, tool_choice="required"
    )
    assert s.grammar.source == "tool_calls"
    c = s.constraint(tok)
    assert tok.decode(c.forced()).startswith("<tool_call>")
    content, calls, finish = s.reply(
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', "stop"
    )
    assert content is None and finish == "tool_calls" and calls[0]["function"]["name"] == "add"
    deltas = tool_call_deltas(calls)
    assert deltas[0]["index"] == 0 and deltas[0]["function"]["arguments"] == '{"a": 1, "b": 2}'
    s = StructuredRequest.from_request(tpl, tools=TOOLS)
    assert s.grammar is None and s.reply("Hello", "stop") == ("Hello", [], "stop")  # "auto": text is text
    assert StructuredRequest.none().constraint(tok) is None


def test_parallel_calls(model):
    tok, tpl = model
    two = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'  # fmt: skip
    for parallel, n_calls in ((None, 1), (False, 1), (True, 2)):
        s = StructuredRequest.from_request(
            tpl, tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel
        )
        c = s.constraint(tok)
        ids = tok.encode(two)
        assert (c.valid_prefix(ids) == len(ids)) == (n_calls == 2)  # a second forced call only when asked
    # In "auto" mode the reply keeps every call unless parallel_tool_calls is false.
    assert len(StructuredRequest.from_request(tpl, tools=TOOLS).reply(two, "stop")[1]) == 2
    assert (
        len(StructuredRequest.from_request(tpl, tools=TOOLS, parallel_tool_calls=False).reply(two, "stop")[1])
        == 1
    )
    stream = StructuredRequest.from_request(tpl, tools=TOOLS, tool_choice="required").stream()
    assert stream.feed(two[:20]) == ""  # a forced call shows no text while it is written
    assert stream.finish() == (two[:20], [])  # cut off by max_tokens: what was written, as a whole reply has
    stream = StructuredRequest.from_request(tpl, tools=TOOLS, tool_choice="required").stream()
    assert stream.feed(two) == "" and stream.finish()[0] == ""


def test_auto_mode_constrains_a_call_once_opened(model):
    tok, tpl = model
    s = StructuredRequest.from_request(tpl, tools=TOOLS)  # "auto"
    assert s.grammar is None and s.constrained
    c = s.constraint(tok)
    c.accept_all(tok.encode("Let me check that for you."))
    assert not c.triggered and not c.done and c.forced() == []
    assert all(c.fits(t) for t in tok.encode("anything { at all"))  # free text before a call
    c.accept_all(tok.encode(" <tool_call>"))
    assert c.triggered
    assert not c.fits(tok.encode("hello")[0])  # after the tag, only the call can follow
    c.accept_all(tok.encode('\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'))
    assert c.done
    # The tag may end inside a token: the bytes after it go to the grammar.
    for text in ('<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>',
                 'Sure!<tool_call>\n{"name":"add","arguments":{"a":3,"b":4}}\n</tool_call>'):  # fmt: skip
        c = s.constraint(tok)
        c.accept_all(tok.encode(text))
        assert c.triggered and c.done
    # No trigger for templates whose calls are bare JSON, nor when response_format constrains the reply.
    assert (
        StructuredRequest.from_request(
            tpl, tools=TOOLS, response_format={"type": "json_object"}
        ).after_trigger
        is None
    )
    assert StructuredRequest.from_request(tpl, tools=TOOLS, tool_choice="none").constraint(tok) is None


REPLIES = [
    'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
    '<tool_call>\n{ "name" : "get_weather" ,"arguments":{"city":"Par\\u00e9is \\"x\\" \\ud83d\\ude00",'
    '"unit":"celsius","n":[1.50, -0, 1e2, true,null,{"x":{}}]}}\n</tool_call>\n'
    '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
    '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1}"}\n</tool_call>',  # arguments as JSON text
    '{"name": "add", "arguments": {"a": 1}}',  # a bare call
    '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',  # not an offered tool: text
]


@pytest.mark.parametrize("text", REPLIES)
@pytest.mark.parametrize("split", [1, 2, 5, 1000])
def test_reply_stream_sends_arguments_in_pieces(text, split):
    from llamacy.structured.call_stream import CallArgs, CallStart, ReplyStream, Text

    s = ReplyStream(["add", "get_weather"])
    events = [e for i in range(0, len(text), split) for e in s.feed(text[i : i + split])]
    streamed_before_end = sum(isinstance(e, CallArgs) for e in events)
    last, calls = s.finish()
    events += last
    content, whole = parse_tool_calls(text, ["add", "get_weather"])
    assert [c["function"]["name"] for c in calls] == [c["function"]["name"] for c in whole]
    starts = [e for e in events if isinstance(e, CallStart)]
    assert [e.id for e in starts] == [c["id"] for c in calls]  # the ids the stream announced
    for i, call in enumerate(calls):
        pieces = [e.text for e in events if isinstance(e, CallArgs) and e.index == i]
        assert "".join(pieces) == call["function"]["arguments"] == whole[i]["function"]["arguments"]
    shown = "".join(e.text for e in events if isinstance(e, Text))
    assert shown.strip() == (content or "").strip()
    if split == 1 and "<tool_call>" in text and calls and '"arguments": "' not in text:
        assert streamed_before_end > 1  # written as generated, not at the end
