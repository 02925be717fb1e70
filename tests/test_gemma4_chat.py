"""Gemma 4's chat format: its template (built in for files without one) rendered and tokenized with the
"gemma4" tokenizer, and the tiny Gemma 4 model of test_gemma4.py chatting through `llamacy run` / `chat`."""

from __future__ import annotations

import json

import pytest

from llamacy.chat_gemma4 import GEMMA4
from llamacy.chat_template import ChatTemplate
from llamacy.tokenizer import Tokenizer
from tests.test_gemma4_tokenizer import gemma4_vocab, metadata


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_metadata(metadata())


def test_a_gemma4_file_without_a_template_gets_gemma4s(tok) -> None:
    tpl = ChatTemplate.from_model({"general.architecture": "gemma4", **metadata()}, tok)
    assert tpl.builtin and tpl.name == "gemma4" and tpl.source == GEMMA4
    assert "built-in gemma4" in tpl.describe()
    # the file's own template wins when it has one
    own = ChatTemplate.from_model({**metadata(), "tokenizer.chat_template": "{{ 'x' }}"}, tok)
    assert own.name == "model"


def test_turns_system_and_the_generation_prompt(tok) -> None:
    tpl = ChatTemplate(GEMMA4, tok, name="gemma4", builtin=True)
    messages = [
        {"role": "system", "content": " Be brief. "},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "<|channel>thought\nhmm<channel|>hi"},
        {"role": "user", "content": "world"},
    ]
    text = tpl.render(messages)
    assert text == (
        "<bos><|turn>system\nBe brief.<turn|>\n"
        "<|turn>user\nhello<turn|>\n"
        "<|turn>model\nhi<turn|>\n"  # earlier thinking is stripped
        "<|turn>user\nworld<turn|>\n"
        "<|turn>model\n<|channel>thought\n<channel|>"
    )
    assert tpl.render(messages[1:2], enable_thinking=True) == (
        "<bos><|turn>system\n<|think|><turn|>\n<|turn>user\nhello<turn|>\n<|turn>model\n"
    )
    v = tok.vocab.token_to_id
    ids = tpl.encode(text)
    head = [tok.bos_id, v["<|turn>"], *tok.encode("system\nBe brief.")]
    assert ids[: len(head)] == head
    assert ids.count(tok.bos_id) == 1  # the template wrote <bos>: not added twice
    assert ids.count(v["<|turn>"]) == 5 and ids.count(v["<turn|>"]) == 4
    tail = [v["<|channel>"], *tok.encode("thought\n"), v["<channel|>"]]
    assert ids[-len(tail) :] == tail
    # the turn end stops generation; a new turn opener written out stops it too
    assert v["<turn|>"] in tpl.stop_ids and "<|turn>" in tpl.stop_strings


def test_tools_and_tool_calls_render_in_gemma4s_syntax(tok) -> None:
    tpl = ChatTemplate(GEMMA4, tok, name="gemma4", builtin=True)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "description": "The city"},
                        "days": {"type": "integer"},
                    },
                    "required": ["city"],
                },
            },
        }
    ]
    call = {
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}},
    }
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    text = tpl.render(messages, tools=tools, add_generation_prompt=False)
    q = '<|"|>'
    assert text == (
        "<bos><|turn>system\n"
        f"<|tool>declaration:get_weather{{description:{q}Weather in a city{q},parameters:{{properties:{{"
        f"city:{{description:{q}The city{q},type:{q}STRING{q}}},days:{{type:{q}INTEGER{q}}}}},"
        f"required:[{q}city{q}],type:{q}OBJECT{q}}}}}<tool|><turn|>\n"
        "<|turn>user\nweather?<turn|>\n"
        f"<|turn>model\n<|tool_call>call:get_weather{{city:{q}Paris{q},days:2}}<tool_call|><turn|>\n"
    )
    v = tok.vocab.token_to_id
    ids = tpl.encode(text)
    assert ids.count(v[q]) == text.count(q) == 14 and v["<|tool_call>"] in ids and v["<|tool>"] in ids


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from tests.hf_gemma4 import write_gemma4_hf_model, write_llama_cpp_gguf

    d = tmp_path_factory.mktemp("g4chat")
    model = write_gemma4_hf_model(d / "hf", seed=1)
    assert model.config["vocab_size"] >= len(gemma4_vocab()["tokens"])
    return write_llama_cpp_gguf(model, d / "g4.gguf", gemma4_vocab=gemma4_vocab())


def test_the_tiny_gemma4_model_loads_and_chats_with_its_tokenizer(model_path) -> None:
    from llamacy.gguf import GGUFFile
    from tests.test_cli import llamacy

    with GGUFFile(model_path) as f:
        tok = Tokenizer.from_metadata(f.metadata)
    assert tok.kind == "gemma4"
    common = ("-m", str(model_path), "-n", "6", "--temp", "0", "-t", "1")
    r = llamacy("run", "hello world", *common, "--verbose")
    assert r.returncode == 0, r.stderr.decode()
    again = llamacy("run", "hello world", *common)
    assert again.returncode == 0 and again.stdout == r.stdout  # greedy: the same text
    c = llamacy("chat", *common, input=b"hello\n")
    err = c.stderr.decode()
    assert c.returncode == 0, err
    assert "built-in gemma4" in err, err
    j = llamacy("info", str(model_path), "--json")
    if j.returncode == 0:
        info = json.loads(j.stdout)
        assert "gemma4" in json.dumps(info)


Q = '<|"|>'


def test_gemma4_tool_calls_are_parsed() -> None:
    from llamacy.structured.tool_parse import parse_tool_calls

    text = (
        f"<|tool_call>call:get_weather{{city:{Q}Paris, {{France}}{Q},days:2,"
        f"opts:{{deep:true,none:null,tags:[{Q}a{Q},1.5]}}}}<tool_call|>"
    )
    content, calls = parse_tool_calls(text, ["get_weather"])
    assert content is None and len(calls) == 1
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {
        "city": "Paris, {France}",
        "days": 2,
        "opts": {"deep": True, "none": None, "tags": ["a", 1.5]},
    }
    # text around calls stays content; two calls; a missing close marker at the end of the reply
    two = f"Sure.<|tool_call>call:f{{}}<tool_call|><|tool_call>call:g{{x:{Q}y{Q}}}"
    content, calls = parse_tool_calls(two, ["f", "g"])
    assert content == "Sure." and [c["function"]["name"] for c in calls] == ["f", "g"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"x": "y"}
    # a tool that is not offered, or arguments that are not Gemma 4's syntax, stay text
    assert parse_tool_calls("<|tool_call>call:h{}<tool_call|>", ["f"]) == (
        "<|tool_call>call:h{}<tool_call|>",
        [],
    )
    bad = f"<|tool_call>call:f{{x:{Q}unterminated}}<tool_call|>"
    assert parse_tool_calls(bad, ["f"]) == (bad, [])


def test_a_rendered_call_parses_back_to_its_arguments(tok) -> None:
    from llamacy.structured.tool_parse import parse_tool_calls

    args = {"city": "Paris", "days": 2, "units": ["C", "F"], "opts": {"deep": False}}
    call = {"type": "function", "function": {"name": "get_weather", "arguments": args}}
    tpl = ChatTemplate(GEMMA4, tok, name="gemma4", builtin=True)
    text = tpl.render(
        [{"role": "assistant", "content": "", "tool_calls": [call]}], add_generation_prompt=False
    )
    reply = text.split("<|turn>model\n", 1)[1].removesuffix("<turn|>\n")
    content, calls = parse_tool_calls(reply, ["get_weather"])
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == args


def test_a_streamed_gemma4_call_is_held_back() -> None:
    from llamacy.structured.tool_parse import ToolCallStream

    reply = f"Let me look.<|tool_call>call:get_weather{{city:{Q}Oslo{Q}}}<tool_call|>"
    s = ToolCallStream(["get_weather"])
    shown = "".join(s.feed(ch) for ch in reply)
    rest, calls = s.finish()
    assert shown == "Let me look." and rest == ""
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}


def test_json_schema_output_on_gemma4(model_path) -> None:
    """The structured-output layer over gemma4's tokenizer (its byte pieces, runs of spaces and tabs as
    user-defined tokens): a json_schema reply finishes and validates."""
    import jsonschema

    from llamacy import Llama

    person = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
    }
    llm = Llama(model_path, n_ctx=256, n_threads=1)
    msgs = [{"role": "user", "content": "Describe a person."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": person}}
    out = llm.create_chat_completion(msgs, temperature=0, max_tokens=200, response_format=fmt)
    # Bounded whitespace (a random model writes the most it may), a bounded integer: it must finish.
    assert out["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(out["choices"][0]["message"]["content"]), person)
