"""Ollama's API on `llamacy serve`: the real server driven with the official ollama client (and raw HTTP
for what the client cannot send). Greedy answers are checked against the OpenAI endpoints of the same
server, streamed and not; errors against Ollama's {"error": "..."} shape."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import threading
import time

import httpx
import pytest

ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")

from llamacy import __version__  # noqa: E402
from llamacy.chat_template import ChatTemplate  # noqa: E402
from tests.test_server import chat_ids, running_server  # noqa: E402

MSGS = [{"role": "user", "content": "Hello there"}]
GREEDY = {"temperature": 0, "num_predict": 10}


@pytest.fixture
def client(tiny_server):
    return ollama.Client(host=tiny_server.url, timeout=60)


@pytest.fixture
def http(tiny_server):
    with httpx.Client(base_url=tiny_server.url, timeout=60) as c:
        yield c


def openai_chat(oai, messages, max_tokens=10, **kw):
    r = oai.chat.completions.create(
        model="tiny", messages=messages, max_tokens=max_tokens, temperature=0, **kw
    )
    return r.choices[0].message.content, r.usage


def ndjson(r: httpx.Response) -> list[dict]:
    assert r.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in r.text.splitlines() if line]


def assert_ollama_error(r: httpx.Response, status: int, fragment: str = "") -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert list(body) == ["error"] and isinstance(body["error"], str)
    assert fragment.lower() in body["error"].lower(), body


def assert_final_shape(obj: dict) -> None:
    """The last object of an answer: Ollama's metrics as integer nanoseconds, an RFC 3339 timestamp."""
    assert obj["model"] == "tiny:latest" and obj["done"] is True
    assert dt.datetime.fromisoformat(obj["created_at"].replace("Z", "+00:00")).tzinfo is not None
    for key in ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration"):
        assert isinstance(obj[key], int) and obj[key] >= 0, key
    assert isinstance(obj["eval_count"], int) and isinstance(obj["eval_duration"], int)
    assert obj["total_duration"] >= obj["prompt_eval_duration"] + obj["eval_duration"]
    assert obj["done_reason"] in ("stop", "length")


# ---- generation --------------------------------------------------------------------------------------


def test_chat_equals_openai(client, tiny_oai, http):
    want, usage = openai_chat(tiny_oai, MSGS)
    r = client.chat(model="tiny", messages=MSGS, options=GREEDY)
    assert r.message.role == "assistant" and r.message.content == want
    assert r.done and r.eval_count == usage.completion_tokens and r.prompt_eval_count == usage.prompt_tokens
    parts = list(client.chat(model="tiny", messages=MSGS, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == want
    assert not any(p.done for p in parts[:-1]) and parts[-1].done and parts[-1].message.content == ""
    # Streaming is the default; the raw lines carry Ollama's fields.
    lines = ndjson(http.post("/api/chat", json={"model": "tiny", "messages": MSGS, "options": GREEDY}))
    assert "".join(x["message"]["content"] for x in lines) == want
    assert all(x["done"] is False and x["message"]["role"] == "assistant" for x in lines[:-1])
    assert_final_shape(lines[-1])
    one = http.post(
        "/api/chat", json={"model": "tiny:latest", "messages": MSGS, "options": GREEDY, "stream": False}
    )
    assert one.headers["content-type"] == "application/json"
    assert_final_shape(one.json())
    assert one.json()["message"] == {"role": "assistant", "content": want}


def test_generate_equals_openai(client, tiny_oai, tiny_llm):
    # A templated prompt (the default) is one user turn, after the system prompt if there is one.
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}]
    want, usage = openai_chat(tiny_oai, msgs)
    r = client.generate(model="tiny", prompt="Why is the sky blue?", system="Be brief.", options=GREEDY)
    assert r.response == want and r.prompt_eval_count == usage.prompt_tokens
    ids = chat_ids(tiny_llm, msgs)
    assert list(r.context) == ids + list(r.context[len(ids) :]) and len(r.context) == len(ids) + r.eval_count
    streamed = list(
        client.generate(
            model="tiny", prompt="Why is the sky blue?", system="Be brief.", options=GREEDY, stream=True
        )
    )
    assert "".join(p.response for p in streamed) == want and streamed[-1].context == r.context
    # raw: the prompt as it is, as /v1/completions takes it; no context comes back.
    c = tiny_oai.completions.create(model="tiny", prompt="Once upon", max_tokens=10, temperature=0)
    r = client.generate(model="tiny", prompt="Once upon", raw=True, options=GREEDY)
    assert r.response == c.choices[0].text and r.context is None
    assert r.eval_count == c.usage.completion_tokens and r.prompt_eval_count == c.usage.prompt_tokens
    streamed = list(client.generate(model="tiny", prompt="Once upon", raw=True, options=GREEDY, stream=True))
    assert "".join(p.response for p in streamed) == c.choices[0].text


def test_context_continues_a_conversation(client, tiny_oai, tiny_llm):
    first = client.generate(model="tiny", prompt="Hi", options={"temperature": 0, "num_predict": 4})
    second = client.generate(model="tiny", prompt="More", context=first.context, options=GREEDY)
    turn = chat_ids(tiny_llm, [{"role": "user", "content": "More"}])
    assert turn[0] == tiny_llm.tokenizer.bos_id  # its template writes BOS: not again in mid-conversation
    prompt = list(first.context) + turn[1:]
    assert second.prompt_eval_count == len(prompt)
    # The same ids as a completion prompt, with the template's end markers as stops: the same answer.
    tpl = ChatTemplate.from_model(tiny_llm.metadata, tiny_llm.tokenizer)
    c = tiny_oai.completions.create(
        model="tiny", prompt=prompt, max_tokens=10, temperature=0, stop=tpl.stop_strings
    )
    assert second.response == c.choices[0].text


def test_options_map_to_the_sampler(client, tiny_oai):
    sampling = {
        "seed": 7,
        "temperature": 0.9,
        "top_k": 20,
        "top_p": 0.9,
        "min_p": 0.01,
        "repeat_penalty": 1.1,
    }
    r = client.generate(model="tiny", prompt="Once upon", raw=True, options={**sampling, "num_predict": 12})
    extra = {k: sampling[k] for k in ("top_k", "min_p", "repeat_penalty")}
    c = tiny_oai.completions.create(
        model="tiny", prompt="Once upon", max_tokens=12, seed=7, temperature=0.9, top_p=0.9, extra_body=extra
    )
    assert r.response == c.choices[0].text
    # num_predict limits the answer; 0 and negative values mean no limit (Ollama's -1 and -2).
    short = client.generate(
        model="tiny", prompt="Once upon", raw=True, options={"temperature": 0, "num_predict": 3}
    )
    assert short.eval_count <= 3 and (short.eval_count < 3 or short.done_reason == "length")
    # stop ends the answer before the stop string.
    full = client.generate(
        model="tiny", prompt="Once upon", raw=True, options={"temperature": 0, "num_predict": 24}
    )
    stop = full.response[len(full.response) // 2 :][:3]
    cut = client.generate(
        model="tiny",
        prompt="Once upon",
        raw=True,
        options={"temperature": 0, "num_predict": 24, "stop": [stop]},
    )
    assert cut.response == full.response[: full.response.index(stop)] and cut.done_reason == "stop"
    # num_ctx smaller than the server's bounds prompt + answer; unknown options are ignored.
    n_prompt = full.prompt_eval_count
    small = client.generate(
        model="tiny",
        prompt="Once upon",
        raw=True,
        options={"temperature": 0, "num_ctx": n_prompt + 2, "foo": 1},
    )
    assert small.eval_count <= 2 and small.response == full.response[: len(small.response)]
    seeded = client.generate(
        model="tiny", prompt="Once upon", raw=True, options={"seed": -1, "num_predict": 2}
    )
    assert seeded.done  # -1: a random seed, as in Ollama


def test_logprobs(client):
    opts = {"temperature": 0, "num_predict": 6}
    r = client.generate(
        model="tiny", prompt="Once upon", raw=True, logprobs=True, top_logprobs=2, options=opts
    )
    assert len(r.logprobs) == r.eval_count and "".join(lp.token for lp in r.logprobs) == r.response
    for lp in r.logprobs:
        assert lp.logprob <= 0 and len(lp.top_logprobs) == 2
        assert lp.top_logprobs[0].token == lp.token  # greedy: the most likely token was taken
    parts = list(client.chat(model="tiny", messages=MSGS, logprobs=True, options=opts, stream=True))
    tokens = [lp.token for p in parts for lp in (p.logprobs or [])]
    assert "".join(tokens) == "".join(p.message.content for p in parts)
    assert client.generate(model="tiny", prompt="Once upon", raw=True, options=opts).logprobs is None


def test_load_requests_and_keep_alive(client, http):
    r = client.generate(model="tiny", prompt="")
    assert r.done and r.done_reason == "load" and r.response == ""
    r = http.post("/api/chat", json={"model": "tiny", "messages": []}).json()
    assert r["done_reason"] == "load" and r["message"] == {"role": "assistant", "content": ""}
    for keep in ("5m", "1h30m", 0, -1, 300.5):
        assert client.generate(model="tiny", prompt="Hi", keep_alive=keep, options={"num_predict": 1}).done
    assert_ollama_error(
        http.post("/api/generate", json={"model": "tiny", "prompt": "Hi", "keep_alive": "soon"}),
        400,
        "keep_alive",
    )


# ---- errors ------------------------------------------------------------------------------------------


def test_errors_in_ollamas_shape(client, http):
    # One model served: any name is that model (an unknown name is a 404 with several: test_server.py).
    assert client.chat(model="nope", messages=MSGS, options={"num_predict": 1}).message.role == "assistant"
    assert client.show("nope:7b").details is not None
    post = lambda path, body: http.post(path, json=body)  # noqa: E731
    assert_ollama_error(post("/api/generate", {"prompt": "Hi"}), 400, "model is required")
    assert_ollama_error(post("/api/chat", {"messages": MSGS}), 400, "model is required")
    assert_ollama_error(http.post("/api/chat", content=b"{not json"), 400, "json")
    assert_ollama_error(
        post("/api/chat", {"model": "tiny", "messages": MSGS, "stream": "yes"}), 400, "stream"
    )
    assert_ollama_error(
        post("/api/chat", {"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}), 400, "role"
    )
    assert_ollama_error(
        post("/api/chat", {"model": "tiny", "messages": MSGS, "format": "yaml"}), 400, "format must be"
    )
    schema = {"type": "integer", "minimum": 3, "maximum": 1}
    assert_ollama_error(
        post("/api/generate", {"model": "tiny", "prompt": "Hi", "format": schema}), 400, "JSON schema"
    )
    assert_ollama_error(
        post("/api/chat", {"model": "tiny", "messages": MSGS, "format": {"type": "objekt"}}), 400, "objekt"
    )
    bad_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}
    assert_ollama_error(
        post("/api/chat", {"model": "tiny", "messages": MSGS, "tools": [bad_tool]}), 400, "tool 'f'"
    )
    call = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "x"}}]}
    assert_ollama_error(
        post("/api/chat", {"model": "tiny", "messages": [*MSGS, call, *MSGS]}),
        400,
        "arguments must be an object",
    )
    assert_ollama_error(
        post("/api/chat", {"model": "tiny", "messages": MSGS, "think": True}), 400, "thinking"
    )
    assert_ollama_error(
        post("/api/generate", {"model": "tiny", "prompt": "Hi", "suffix": "end"}), 400, "insert"
    )
    assert_ollama_error(
        post("/api/generate", {"model": "tiny", "prompt": "Hi", "template": "{{ .Prompt }}"}), 400, "template"
    )
    assert_ollama_error(
        post("/api/generate", {"model": "tiny", "prompt": "Hi", "images": ["aGk="]}), 400, "images"
    )
    assert_ollama_error(
        post("/api/generate", {"model": "tiny", "prompt": "Hi", "top_logprobs": 2}), 400, "logprobs"
    )
    assert_ollama_error(
        post("/api/generate", {"model": "tiny", "prompt": "Hi", "context": [10**9]}), 400, "vocabulary"
    )

    # Unknown fields are ignored, as Ollama ignores them; an empty tool list is no tools.
    ok = post(
        "/api/generate",
        {"model": "tiny", "prompt": "Hi", "stream": False, "foo": 1, "options": {"num_predict": 1}},
    )
    assert ok.status_code == 200 and ok.json()["done"] is True
    assert (
        post(
            "/api/chat",
            {"model": "tiny", "messages": MSGS, "tools": [], "stream": False, "options": {"num_predict": 1}},
        ).status_code
        == 200
    )


def test_option_errors(http):
    def gen(options: dict) -> httpx.Response:
        return http.post(
            "/api/generate", json={"model": "tiny", "prompt": "Hi", "stream": False, "options": options}
        )

    assert_ollama_error(gen({"temperature": "hot"}), 400, 'option "temperature"')
    assert_ollama_error(gen({"num_predict": "many"}), 400, "integer")
    assert_ollama_error(gen({"stop": "x"}), 400, "array")
    assert_ollama_error(gen({"use_mmap": 1}), 400, "boolean")
    assert_ollama_error(gen({"mirostat": 2}), 400, "mirostat")
    assert_ollama_error(gen({"temperature": -1}), 400, "temperature")
    assert_ollama_error(gen({"num_ctx": 1}), 400, "num_ctx")
    assert (
        gen(
            {"mirostat": 0, "typical_p": 1.0, "num_thread": 4, "use_mmap": True, "num_predict": 1}
        ).status_code
        == 200
    )


# ---- models ------------------------------------------------------------------------------------------


def test_tags_show_ps_version(client, http, tiny_llm, tiny_gguf):
    models = client.list().models
    assert [m.model for m in models] == ["tiny:latest"]
    m = models[0]
    assert m.size == tiny_gguf.stat().st_size
    assert m.digest == hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    assert m.details.format == "gguf" and m.details.family == "llama" and m.details.families == ["llama"]
    assert m.details.quantization_level == "Q8_0" and m.details.parameter_size
    raw = http.get("/api/tags").json()["models"][0]
    assert (
        set(raw) == {"name", "model", "modified_at", "size", "digest", "details"}
        and raw["name"] == "tiny:latest"
    )
    assert set(raw["details"]) == {
        "parent_model",
        "format",
        "family",
        "families",
        "parameter_size",
        "quantization_level",
    }

    s = client.show("tiny")
    tpl = ChatTemplate.from_model(tiny_llm.metadata, tiny_llm.tokenizer)
    assert s.template == tpl.source and s.details.family == "llama" and "completion" in s.capabilities
    assert s.modelinfo["general.architecture"] == "llama" and s.modelinfo["general.parameter_count"] > 0
    assert s.modelinfo["tokenizer.ggml.tokens"] == []  # long arrays only when verbose, as Ollama does
    assert "num_ctx" in s.parameters and '"<|im_end|>"' in s.parameters and f"FROM {tiny_gguf}" in s.modelfile
    verbose = http.post("/api/show", json={"model": "tiny:latest", "verbose": True}).json()
    assert len(verbose["model_info"]["tokenizer.ggml.tokens"]) == tiny_llm.n_vocab
    assert http.post("/api/show", json={"name": "tiny"}).status_code == 200  # the older spelling
    assert_ollama_error(http.post("/api/show", json={}), 400, "model is required")

    running = client.ps().models
    assert [p.model for p in running] == ["tiny:latest"]
    assert running[0].size > 0 and running[0].size_vram == 0 and running[0].context_length == 128
    assert running[0].expires_at > dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=365)
    assert running[0].digest == m.digest

    assert http.get("/api/version").json() == {"version": __version__}


def test_guards_answer_in_ollamas_shape(tiny_llm):
    """The API key, the body size limit and the router answer Ollama's paths in Ollama's shape."""
    with running_server(tiny_llm, parallel=1, api_key="k", max_body_bytes=4096) as (srv, _sched):
        c = ollama.Client(host=srv.url, headers={"Authorization": "Bearer k"})
        assert [m.model for m in c.list().models] == ["tiny:latest"]
        with pytest.raises(ollama.ResponseError) as e:
            ollama.Client(host=srv.url).list()
        assert e.value.status_code == 401
        assert_ollama_error(httpx.get(srv.url + "/api/tags"), 401, "API key")
        auth = {"Authorization": "Bearer k"}
        big = {"model": "tiny", "prompt": "x" * 5000}
        assert_ollama_error(httpx.post(srv.url + "/api/generate", json=big, headers=auth), 413, "larger")
        assert_ollama_error(httpx.post(srv.url + "/api/tags", headers=auth), 405)
        # The OpenAI paths keep OpenAI's shape.
        assert httpx.get(srv.url + "/v1/models").json()["error"]["code"] == "invalid_api_key"


# ---- the real models ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize("model", ["default_model_path", "gemma_model_path"])
def test_real_models_answer_as_the_openai_endpoint(model, request):
    from llamacy import Llama

    tiny_llm = Llama(request.getfixturevalue(model), n_ctx=512, n_threads=2)
    with running_server(tiny_llm, parallel=2) as (srv, _sched):
        c = ollama.Client(host=srv.url, timeout=300)
        oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        msgs = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
        want = oai.chat.completions.create(model="tiny", messages=msgs, max_tokens=24, temperature=0)
        opts = {"temperature": 0, "num_predict": 24}
        r = c.chat(model="tiny", messages=msgs, options=opts)
        assert r.message.content == want.choices[0].message.content
        assert r.eval_count == want.usage.completion_tokens
        if model == "default_model_path":  # SmolLM2 answers this one and ends its turn (Gemma 3 270M rambles)
            assert r.done_reason == "stop" and "Paris" in r.message.content
        streamed = "".join(
            p.message.content for p in c.chat(model="tiny", messages=msgs, options=opts, stream=True)
        )
        assert streamed == r.message.content
        g = c.generate(model="tiny", prompt=msgs[0]["content"], options=opts)
        assert g.response == r.message.content
        raw = oai.completions.create(
            model="tiny", prompt="The capital of France is", max_tokens=8, temperature=0
        )
        g = c.generate(
            model="tiny",
            prompt="The capital of France is",
            raw=True,
            options={"temperature": 0, "num_predict": 8},
        )
        assert g.response == raw.choices[0].text


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.mark.slow
@pytest.mark.model
def test_format_and_tools_with_the_real_model(default_model_path):
    """format "json" and a JSON schema on /api/generate and /api/chat, streamed and not; a tool call in
    Ollama's shape (arguments an object) and a follow-up turn carrying it and the tool's result."""
    from llamacy import Llama
    from llamacy.scheduler import Scheduler
    from llamacy.server import ServerSettings, ServerThread, create_app

    tiny_llm = Llama(default_model_path, n_ctx=1024, n_threads=2)
    sched = Scheduler(tiny_llm, n_parallel=2, n_ctx=1024, n_threads=2).start()
    tpl = ChatTemplate.from_model(tiny_llm.metadata, tiny_llm.tokenizer)
    srv = ServerThread(create_app(sched, tpl, ServerSettings(model_name="tiny"))).start()
    try:
        _format_and_tools(srv)
    finally:
        sched.shutdown()
        srv.stop()


def _format_and_tools(srv) -> None:
    import jsonschema

    c = ollama.Client(host=srv.url, timeout=300)
    opts = {"temperature": 0, "num_predict": 60}
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
    }
    ask = [{"role": "user", "content": "Describe a person."}]
    r = c.chat(model="tiny", messages=ask, format=schema, options=opts)
    jsonschema.validate(json.loads(r.message.content), schema)
    streamed = "".join(
        p.message.content
        for p in c.chat(model="tiny", messages=ask, format=schema, options=opts, stream=True)
    )
    assert streamed == r.message.content
    g = c.generate(model="tiny", prompt="Describe a person.", format=schema, options=opts)
    jsonschema.validate(json.loads(g.response), schema)
    # JSON mode: any object (cut short by num_predict, it is still an object's beginning).
    g = c.generate(model="tiny", prompt="Give me a user as JSON", format="json", options=opts)
    assert g.response.lstrip().startswith("{")
    if g.done_reason == "stop":
        assert isinstance(json.loads(g.response), dict)
    streamed = "".join(
        p.response
        for p in c.generate(
            model="tiny", prompt="Give me a user as JSON", format="json", options=opts, stream=True
        )
    )
    assert streamed == g.response
    raw = c.generate(model="tiny", prompt="A JSON list of colors:", raw=True, format="json", options=opts)
    assert raw.response.lstrip().startswith("{")

    # A tool call: no tool_choice in Ollama's API, so the conversation asks for one, and shows one (an
    # earlier call of the tool, in Ollama's shape): a 135M model follows the pattern. Asking alone put the
    # call's first token within 0.1 logit of plain text, so a float-order change (issue #29) flipped it.
    calling = [
        {"role": "system", "content": "Answer only with a <tool_call>."},
        {"role": "user", "content": "Weather in Rome?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Rome"}}}],
        },
        {"role": "user", "content": "Weather in Paris?"},
    ]
    r = c.chat(model="tiny", messages=calling, tools=[WEATHER], options=opts)
    assert r.message.content == "" and r.done_reason == "stop"
    [call] = r.message.tool_calls
    assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)
    jsonschema.validate(dict(call.function.arguments), WEATHER["function"]["parameters"])
    parts = list(c.chat(model="tiny", messages=calling, tools=[WEATHER], options=opts, stream=True))
    assert "".join(p.message.content for p in parts) == ""
    assert [tc for p in parts for tc in p.message.tool_calls or []] == [call]
    assert parts[-1].done and not parts[-2].done and parts[-2].message.tool_calls
    # The raw wire shape: arguments an object, not JSON text. (The tools as the client sends them: its
    # key order makes the prompt, and a model this small answers a different prompt differently.)
    sent = [ollama.Tool.model_validate(WEATHER).model_dump(exclude_none=True)]
    wire = httpx.post(
        srv.url + "/api/chat",
        json={"model": "tiny", "messages": calling, "tools": sent, "stream": False, "options": opts},
        timeout=300,
    ).json()
    assert wire["message"]["tool_calls"] == [
        {"function": {"name": "get_weather", "arguments": dict(call.function.arguments)}}
    ]

    # The follow-up turn: the assistant's call and the tool's result, as the client sends them back.
    follow = [
        *calling,
        r.message,
        {"role": "tool", "content": '{"temperature": 21}', "tool_name": "get_weather"},
    ]
    r2 = c.chat(model="tiny", messages=follow, tools=[WEATHER], options=opts)
    assert r2.message.content or r2.message.tool_calls
    r3 = c.chat(model="tiny", messages=follow, options=opts)  # no tools offered: the history still renders
    assert r3.message.content
    # The same prompt as the OpenAI route's for the same conversation (through the tool prompt).
    oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)

    def oai_call(i: int, arguments: dict) -> dict:
        return {"id": f"call_{i}", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(arguments)}}  # fmt: skip

    oai_calling = [*calling[:2], {"role": "assistant", "content": "", "tool_calls": [oai_call(0, {"city": "Rome"})]}, calling[3]]  # fmt: skip
    want = oai.chat.completions.create(
        model="tiny",
        messages=[*oai_calling, {"role": "assistant", "content": "", "tool_calls": [oai_call(1, dict(call.function.arguments))]}, {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'}],
        tools=sent, max_tokens=60, temperature=0,
    )  # fmt: skip
    assert r2.prompt_eval_count == want.usage.prompt_tokens


@pytest.mark.slow
@pytest.mark.model
def test_several_models(default_model_path, gemma_model_path):
    """With the registry of `llamacy serve -m A -m B`: /api/tags lists every model without loading it,
    /api/ps the loaded ones with their expiry under --idle-unload, and a request's model loads it."""
    from llamacy.server.models import ModelSpec
    from tests.test_server_models import NAMES, footprint, serving

    with serving([ModelSpec(n, n, footprint(n)) for n in NAMES], idle_unload_s=600) as (srv, registry):
        c = ollama.Client(host=srv.url, timeout=300)
        tags = c.list().models
        assert [m.model for m in tags] == [f"{n}:latest" for n in NAMES]
        assert [m.details.family for m in tags] == ["llama", "gemma3"]
        assert [m.details.quantization_level for m in tags] == ["Q4_1", "Q4_K_M"]
        assert not any(registry.is_loaded(n) for n in NAMES)  # read from their files
        assert c.ps().models == []
        opts = {"temperature": 0, "num_predict": 4}
        r = c.generate(model="gemma3-270m:latest", prompt="The capital of France is", raw=True, options=opts)
        assert r.model == "gemma3-270m:latest" and r.eval_count > 0
        again = c.generate(model="gemma3-270m", prompt="The capital of France is", raw=True, options=opts)
        assert again.response == r.response
        assert r.load_duration > 10 * again.load_duration  # the first request loaded the model
        assert r.total_duration > r.load_duration + r.prompt_eval_duration + r.eval_duration
        assert registry.is_loaded("gemma3-270m") and not registry.is_loaded("smollm2-135m")
        running = c.ps().models
        assert [p.model for p in running] == ["gemma3-270m:latest"]
        left = running[0].expires_at - dt.datetime.now(dt.timezone.utc)
        assert dt.timedelta(seconds=500) < left <= dt.timedelta(seconds=600)
        shown = c.show("smollm2-135m")  # shown once loaded
        assert shown.details.family == "llama" and shown.license == "apache-2.0"
        assert [p.model for p in c.ps().models] == [f"{n}:latest" for n in NAMES]  # in the registry's order


def test_full_queue_and_shutdown(tiny_llm):
    # A scheduler that is not started holds every request in its queue: the next one finds it full.
    with running_server(tiny_llm, start=False, queue_size=1) as (srv, sched):
        c = ollama.Client(host=srv.url, timeout=30)
        errors: list[Exception] = []

        def first() -> None:
            try:
                list(c.generate(model="tiny", prompt="Hi", stream=True, options={"num_predict": 2}))
            except ollama.ResponseError as e:
                errors.append(e)

        t = threading.Thread(target=first)
        t.start()
        deadline = time.monotonic() + 10
        while sched.queue_depth < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = httpx.post(srv.url + "/api/chat", json={"model": "tiny", "messages": MSGS})
        assert_ollama_error(r, 429, "queue is full")
        sched.shutdown()  # the queued request's stream ends with Ollama's error line
        t.join(10)
        assert len(errors) == 1 and "shut" in errors[0].error
