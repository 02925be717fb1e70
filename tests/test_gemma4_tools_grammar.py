"""Constrained tool calls in Gemma 4's own syntax, `<|tool_call>call:NAME{key:value,...}<tool_call|>`: the
grammar generated from the tools' schemas (accepts what the template renders, rejects a bare JSON call), the
"auto" trigger, streamed arguments, and the tiny gemma4 model of test_gemma4_chat.py (random weights, real
gemma4 vocabulary) calling tools through the Python API and the server."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from llamacy.chat_gemma4 import GEMMA4
from llamacy.chat_template import ChatTemplate
from llamacy.structured import Constraint, StructuredRequest, ToolPlan, next_tokens, parse_tool_calls
from llamacy.structured.call_stream import CallArgs, CallStart, ReplyStream
from llamacy.structured.call_syntax import CallSyntax
from llamacy.structured.gemma4_scan import Gemma4CallScan
from llamacy.tokenizer import Tokenizer
from tests.test_gemma4_tokenizer import gemma4_vocab, metadata

Q = '<|"|>'
# Bounded everywhere: a random model writes the most it may, and must still finish.
PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"type": "string", "enum": ["C", "F"]},  # (the template needs a type)
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
        "opts": {
            "type": "object",
            "properties": {"deep": {"type": "boolean"}, "level": {"type": ["number", "null"], "maximum": 9}},
            "required": ["deep"],
        },
    },
    "required": ["city", "days"],
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}
PING = {"type": "function", "function": {"name": "ping", "description": "Is the service up?"}}
TOOLS = [WEATHER, PING]
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]
# For the model: the test vocabulary spells a tool declaration nearly character by character (the tools above
# make a 453-token prompt), so the model's tools are smaller and its context 512 (it was trained on 256 in
# test_gemma4_chat.py: a random model does not care).
SMALL = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 6},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
        "unit": {"type": "string", "enum": ["C", "F"]},
    },
    "required": ["city", "days"],
}
MODEL_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SMALL}}, PING]
N_CTX = 512


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_metadata(metadata())


@pytest.fixture(scope="module")
def tpl(tok) -> ChatTemplate:
    return ChatTemplate(GEMMA4, tok, name="gemma4", builtin=True)


def rendered(tpl: ChatTemplate, *calls: tuple[str, dict]) -> str:
    """The reply text the template writes for these calls."""
    tool_calls = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
    text = tpl.render(
        [{"role": "assistant", "content": "", "tool_calls": tool_calls}], add_generation_prompt=False
    )
    return text.split("<|turn>model\n", 1)[1].removesuffix("<turn|>\n")


def token_ids(tpl: ChatTemplate, text: str) -> list[int]:
    ids = tpl.encode(text)
    return ids[1:] if ids and ids[0] == tpl.tokenizer.bos_id else ids


def accepts(grammar, tpl: ChatTemplate, text: str) -> bool:
    """The whole text fits the grammar and completes it."""
    c = Constraint(grammar, tpl.tokenizer)
    ids = token_ids(tpl, text)
    if c.valid_prefix(ids) < len(ids):
        return False
    c.accept_all(ids)
    return c.accepting


def test_the_call_syntax_comes_from_the_template(tpl) -> None:
    assert CallSyntax.of(tpl) is CallSyntax.GEMMA4 and CallSyntax.GEMMA4.trigger == "<|tool_call>"
    assert CallSyntax.of(None) is CallSyntax.TAGGED and CallSyntax.TAGGED.trigger == "<tool_call>"
    s = StructuredRequest.from_request(tpl, tools=TOOLS)
    assert s.syntax is CallSyntax.GEMMA4 and s.after_trigger is not None
    assert not ToolPlan.from_request(TOOLS, "required").wrapped(tpl)


def test_the_grammar_accepts_rendered_calls_and_rejects_others(tpl) -> None:
    g = ToolPlan.from_request(TOOLS, "required").grammar(tpl)
    full = {
        "city": "Oslo",
        "days": 3,
        "unit": "C",
        "tags": ["a", "bc"],
        "opts": {"deep": False, "level": 2.5},
    }
    for args in (
        {"city": "Oslo", "days": 3},
        full,
        {"days": 14, "city": ""},
        {**full, "opts": {"deep": True}},
    ):
        assert accepts(g, tpl, rendered(tpl, ("get_weather", args))), args
    assert accepts(g, tpl, rendered(tpl, ("ping", {})))
    bare = json.dumps({"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}})
    assert not accepts(g, tpl, bare)
    assert not accepts(g, tpl, f"<tool_call>\n{bare}\n</tool_call>")
    for bad in (
        {"city": "Oslo"},  # a required key missing
        {"city": "Oslo", "days": 15},  # above the maximum
        {"city": "Oslo", "days": 3, "unit": "K"},  # not in the enum
        {"city": "Oslo, Norway", "days": 3},  # longer than maxLength
        {"city": "Oslo", "days": 3, "tags": ["a", "b", "c"]},  # more than maxItems
        {"city": "Oslo", "days": 3, "extra": 1},  # not a listed property
        {"city": "Oslo", "days": 3, "opts": {"deep": True, "level": 9.5}},
    ):
        assert not accepts(g, tpl, rendered(tpl, ("get_weather", bad))), bad
    assert not accepts(g, tpl, rendered(tpl, ("get_time", {})))  # not an offered tool
    # keys in another order than the template's (sorted) are not what the model was trained on
    q = Q
    assert not accepts(g, tpl, f"<|tool_call>call:get_weather{{days:3,city:{q}Oslo{q}}}<tool_call|>")
    # one call only, unless parallel calls were asked for; then calls follow each other with nothing between
    two = rendered(tpl, ("ping", {}), ("get_weather", {"city": "a", "days": 1}))
    assert not accepts(g, tpl, two)
    assert accepts(ToolPlan.from_request(TOOLS, "required", True).grammar(tpl), tpl, two)
    named = ToolPlan.from_request(TOOLS, {"type": "function", "function": {"name": "ping"}}).grammar(tpl)
    assert accepts(named, tpl, rendered(tpl, ("ping", {})))
    assert not accepts(named, tpl, rendered(tpl, ("get_weather", {"city": "a", "days": 1})))


def test_schema_features(tpl) -> None:
    """$ref (recursive), anyOf, const, numbers in ranges, open objects, a string with the quote token."""
    node = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 5},
            "kids": {"type": "array", "items": {"$ref": "#"}},
        },
        "required": ["name"],
    }
    params = {
        "type": "object",
        "properties": {
            "tree": {"$ref": "#/$defs/node"},
            "id": {"anyOf": [{"type": "integer", "exclusiveMinimum": 0}, {"const": "none"}]},
            "x": {"type": "number", "minimum": -2.5, "maximum": 3},
            "meta": {"type": "object"},
        },
        "$defs": {
            "node": {
                **node,
                "properties": {
                    **node["properties"],
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
            }
        },
    }
    tools = [{"type": "function", "function": {"name": "f", "parameters": params}}]
    g = ToolPlan.from_request(tools, "required").grammar(tpl)
    ok = [
        {"tree": {"name": "a", "kids": [{"name": "b", "kids": []}]}},
        {"id": 7, "x": -1.25, "meta": {"k": [1, {"z": True}]}},  # (the template writes None as "None")
        {"id": "none", "x": 3},
        {"x": 0.5},
    ]
    for args in ok:
        assert accepts(g, tpl, rendered(tpl, ("f", args))), args
    for args in ({"id": 0}, {"x": 3.5}, {"x": -3}, {"id": "other"}, {"tree": {"kids": []}}):
        assert not accepts(g, tpl, rendered(tpl, ("f", args))), args
    assert not accepts(g, tpl, f"<|tool_call>call:f{{meta:{{k:{Q}a{Q}b{Q}}}}}<tool_call|>")


def test_auto_grammar_follows_the_trigger(tok, tpl) -> None:
    s = StructuredRequest.from_request(tpl, tools=TOOLS)
    c = s.constraint(tok)
    text = "Let me see." + rendered(tpl, ("get_weather", {"city": "Oslo", "days": 2}))
    ids = token_ids(tpl, text)
    for i in ids:
        assert c.fits(i)
        c.accept(i)
    assert c.triggered and c.done
    # once the call is open, what follows must be a call of an offered tool
    c = s.constraint(tok)
    c.accept_all(token_ids(tpl, "Hm.<|tool_call>"))
    assert c.triggered
    assert not c.fits(token_ids(tpl, "{")[0]) and c.fits(token_ids(tpl, "call:")[0])


CALL_BODIES = [
    f"call:f{{city:{Q}Paris, {{France}}{Q},days:2,opts:{{deep:true,none:null,tags:[{Q}a{Q},1.5]}}}}<tool_call|>",
    "call:f{}<tool_call|>",
    f'call:f{{a:[],b:{{}},c:[[1,2],[]],d:-0.50,e:1e2,f:{Q}{Q},g:{Q}<|"x \\n"\t{Q}}}<tool_call|>',
    "call:f{a:1,}<tool_call|>",
    f"call:f{{{Q}k:y{Q}:3,x:abc}}<tool_call|>",
    "call:f{a:[1,],b:<x}",
    f'call:f{{u:{Q}é😀 "q"{Q}}}',
]


@pytest.mark.parametrize("body", CALL_BODIES)
def test_a_scanned_call_gives_the_parsed_arguments_in_pieces(body) -> None:
    [call] = parse_tool_calls("<|tool_call>" + body, ["f"])[1]
    want = call["function"]["arguments"]
    rng = random.Random(0)
    for split in ("whole", "chars", "random"):
        scan = Gemma4CallScan()
        if split == "whole":
            scan.feed(body)
        else:
            i = 0
            while i < len(body):
                n = 1 if split == "chars" else rng.randint(1, 6)
                scan.feed(body[i : i + n])
                i += n
        assert scan.name == "f" and "".join(scan.arguments) == want, split


def test_a_reply_stream_streams_gemma4_calls() -> None:
    reply = (
        f"Sure.<|tool_call>call:f{{x:{Q}hello world{Q},n:12}}<tool_call|><|tool_call>call:g{{}}<tool_call|>"
    )
    rs = ReplyStream(["f", "g"], syntax=CallSyntax.GEMMA4)
    events = [e for ch in reply for e in rs.feed(ch)]
    starts = [e.name for e in events if isinstance(e, CallStart)]
    args = [e for e in events if isinstance(e, CallArgs)]
    more, calls = rs.finish()
    assert starts == ["f", "g"] and len(args) > 2  # streamed before the reply ended
    events += more
    for i, call in enumerate(calls):
        pieces = [e.text for e in events if isinstance(e, CallArgs) and e.index == i]
        assert "".join(pieces) == call["function"]["arguments"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"x": "hello world", "n": 12}


# ---- the tiny gemma4 model ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from tests.hf_gemma4 import write_gemma4_hf_model, write_llama_cpp_gguf

    d = tmp_path_factory.mktemp("g4tools")
    model = write_gemma4_hf_model(d / "hf", seed=1, max_position_embeddings=N_CTX)
    return write_llama_cpp_gguf(model, d / "g4.gguf", gemma4_vocab=gemma4_vocab())


@pytest.fixture(scope="module")
def llm(model_path):
    from llamacy import Llama

    return Llama(model_path, n_ctx=N_CTX, n_threads=1)


def check_calls(out: dict, raw: str) -> list[dict]:
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls", raw
    assert "<|tool_call>call:" in raw and "{" not in raw.split("call:", 1)[0]
    calls = choice["message"]["tool_calls"]
    for call in calls:
        schema = SMALL if call["function"]["name"] == "get_weather" else {"type": "object", "properties": {}}
        jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
    return calls


@pytest.mark.parametrize(
    "choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
def test_a_forced_call_on_the_model(llm, choice) -> None:
    out = llm.create_chat_completion(
        ASK, tools=MODEL_TOOLS, tool_choice=choice, temperature=0, max_tokens=120
    )
    calls = check_calls(out, llm.last.text)
    assert len(calls) == 1
    if isinstance(choice, dict):
        assert calls[0]["function"]["name"] == "get_weather"


def test_parallel_calls_on_the_model(llm) -> None:
    """Calls follow each other under the grammar; whether the model writes another is its choice (sampled
    here: greedy, this model stops after one), so a few seeds are tried for a reply with several."""
    most = 0
    for seed in range(4):
        out = llm.create_chat_completion(
            ASK, tools=MODEL_TOOLS, tool_choice="required", parallel_tool_calls=True,
            temperature=1.0, seed=seed, max_tokens=150,
        )  # fmt: skip
        raw = llm.last.text
        calls = check_calls(out, raw)
        assert len(calls) == raw.count("<tool_call|>") >= 1  # (a call cut off by max_tokens is dropped)
        most = max(most, len(calls))
    assert most >= 2


def test_auto_call_opened_by_the_model_is_valid(llm) -> None:
    """ "auto": the reply opens a call (scripted: a random model rarely does on its own); the model writes
    the rest under the grammar, and the reply parses into a valid call."""
    from llamacy.chat_api import chat_template
    from llamacy.sampling import Sampler, SamplingParams

    tpl = chat_template(llm)
    assert tpl.name == "gemma4"
    s = StructuredRequest.from_request(tpl, tools=MODEL_TOOLS)
    c = s.constraint(llm.tokenizer, llm.n_vocab)
    ids = tpl.encode(s.render(tpl, ASK, add_generation_prompt=True))
    out = token_ids(tpl, "I'll check.<|tool_call>")
    c.accept_all(out)
    assert c.triggered
    llm.reset()
    logits = llm.model.eval(ids + out, logits="last")
    sampler = Sampler(SamplingParams(temperature=0), llm.n_vocab)
    while not c.done and len(out) < 120:
        history = ids + out
        toks = next_tokens(c, lambda mask, h=history, x=logits: sampler.sample(x, h, mask), tpl.stop_ids, 120)
        if not toks:
            break
        out += toks
        logits = llm.model.eval(toks, logits="last")
    assert c.done
    text = llm.detokenize(out)
    content, calls, finish = s.reply(text, "stop")
    assert content == "I'll check." and len(calls) == 1 and finish == "tool_calls", text
    name = calls[0]["function"]["name"]
    schema = SMALL if name == "get_weather" else {"type": "object", "properties": {}}
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), schema)


@pytest.fixture(scope="module")
def url(llm):
    from llamacy.scheduler import Scheduler
    from llamacy.server import ServerSettings, ServerThread, create_app

    sched = Scheduler(llm, n_parallel=1, n_ctx=N_CTX, n_threads=1).start()
    tpl = ChatTemplate.from_model(llm.metadata, llm.tokenizer)
    srv = ServerThread(create_app(sched, tpl, ServerSettings(model_name="g4"))).start()
    yield srv.url
    sched.shutdown()
    srv.stop()


def test_streamed_arguments_through_the_server(url) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
    forced = {"type": "function", "function": {"name": "get_weather"}}
    kw = {
        "model": "g4",
        "messages": ASK,
        "tools": MODEL_TOOLS,
        "tool_choice": forced,
        "max_tokens": 120,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**kw)
    assert whole.choices[0].finish_reason == "tool_calls"
    [call] = whole.choices[0].message.tool_calls
    pieces, ids = [], []
    for chunk in client.chat.completions.create(**kw, stream=True):
        for tc in chunk.choices[0].delta.tool_calls or []:
            assert tc.index == 0
            ids += [tc.id] if tc.id else []
            pieces.append(tc.function.arguments or "")
    assert len([p for p in pieces if p]) > 1 and len(ids) == 1
    assert "".join(pieces) == call.function.arguments
    jsonschema.validate(json.loads(call.function.arguments), SMALL)
