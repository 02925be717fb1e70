"""`llamacy serve`: the real server (uvicorn, 127.0.0.1, a free port) driven with the official openai client
and raw HTTP. Answers are checked against the single-sequence engine with the same seed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Literal

import httpx
import pytest
from pydantic import BaseModel, ConfigDict

openai = pytest.importorskip("openai")

from llamacy.chat_template import ChatTemplate  # noqa: E402
from llamacy.scheduler import Scheduler  # noqa: E402
from llamacy.server import ServerSettings, ServerThread, create_app  # noqa: E402
from llamacy.server.job_store import JobStore  # noqa: E402
from tests.conftest import default_sigint  # noqa: E402

API_KEY = "test-key"


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from tests.model_factory import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("server") / "tiny.gguf")


@pytest.fixture(scope="module")
def llm(tiny_path):
    from llamacy import Llama

    return Llama(tiny_path, n_ctx=128, n_threads=1)


@contextmanager
def running_server(
    llm, scheduler_cls=Scheduler, start=True, api_key=None, parallel=3, queue_size=32, **settings
):
    sched = scheduler_cls(llm, n_parallel=parallel, n_ctx=128, n_threads=1, queue_size=queue_size)
    if start:
        sched.start()
    tpl = ChatTemplate.from_model(llm.metadata, llm.tokenizer)
    app = create_app(sched, tpl, ServerSettings(api_key=api_key, model_name="tiny", **settings))
    srv = ServerThread(app).start()
    try:
        yield srv, sched
    finally:
        sched.shutdown()
        srv.stop()


@pytest.fixture(scope="module")
def server(llm):
    with running_server(llm, api_key=API_KEY) as (srv, _sched):
        yield srv


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {API_KEY}"}) as c:
        yield c


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=30)


def solo_text(llm, prompt: str | list[int], max_tokens: int, **sampling) -> str:
    return "".join(llm.generate(prompt, max_tokens=max_tokens, **sampling))


def chat_ids(llm, messages) -> list[int]:
    tpl = ChatTemplate.from_model(llm.metadata, llm.tokenizer)
    return tpl.encode(tpl.render(messages, add_generation_prompt=True))


def sse_events(response: httpx.Response) -> list:
    """The data payloads of an SSE stream, [DONE] as the string."""
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
        else:
            assert line == "", line
    return out


def assert_error(r: httpx.Response, status: int, fragment: str = "") -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "code"}
    assert fragment.lower() in err["message"].lower()
    return err


# ---- endpoints ---------------------------------------------------------------------------------------


def test_health_models_metrics(server, http, client):
    assert httpx.get(server.url + "/health").json()["status"] == "ok"  # no key needed
    assert [m.id for m in client.models.list().data] == ["tiny"]
    client.completions.create(model="tiny", prompt="Hello", max_tokens=2)
    text = http.get("/metrics").text
    for name in (
        "llamacy_requests_total",
        "llamacy_prompt_tokens_total",
        "llamacy_generated_tokens_total",
        "llamacy_queue_depth",
        "llamacy_active_sequences",
        "llamacy_generation_tokens_per_second",
    ):
        assert f"# TYPE {name} " in text
    assert 'llamacy_requests_total{endpoint="/v1/completions",status="200"}' in text
    for line in text.splitlines():  # every sample line is `name{labels} number`
        if not line.startswith("#"):
            float(line.rsplit(" ", 1)[1])


def test_completion_equals_solo_engine(llm, client):
    r = client.completions.create(
        model="tiny", prompt="The capital of France is", max_tokens=10, seed=5, temperature=0.9
    )
    assert r.choices[0].text == solo_text(llm, "The capital of France is", 10, temperature=0.9, seed=5)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == len(llm.tokenize("The capital of France is"))
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # Token ids as the prompt, echo, and the default of 16 tokens.
    ids = llm.tokenize("Hello")
    r = client.completions.create(model="tiny", prompt=ids, temperature=0, echo=True)
    assert r.choices[0].text == "Hello" + solo_text(llm, ids, 16, temperature=0)
    assert r.usage.completion_tokens <= 16
    # llama.cpp's ignore_eos: exactly max_tokens tokens.
    r = client.completions.create(model="tiny", prompt="Hi", max_tokens=40, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 40 and r.choices[0].finish_reason == "length"


def test_completion_stream(llm, client, http):
    expected = solo_text(llm, "Once upon", 12, temperature=0.8, seed=2)
    chunks = list(
        client.completions.create(
            model="tiny", prompt="Once upon", max_tokens=12, seed=2, temperature=0.8, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert (
        chunks[-1].choices[0].finish_reason in ("stop", "length") and chunks[-1].usage.completion_tokens > 0
    )
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    with http.stream(
        "POST",
        "/v1/completions",
        json={"prompt": "Once upon", "max_tokens": 12, "seed": 2, "temperature": 0.8, "stream": True},
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == expected
    assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert events[-2]["usage"]["completion_tokens"] == chunks[-1].usage.completion_tokens


def test_chat_stream_and_not(llm, client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    expected = solo_text(
        llm, chat_ids(llm, messages), 12, temperature=0.7, seed=9, stop=["<|im_end|>", "<|im_start|>"]
    )
    r = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=12, temperature=0.7, seed=9
    )
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == expected
    assert r.usage.prompt_tokens == len(chat_ids(llm, messages))
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=12, temperature=0.7, seed=9, stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    # Content given as parts, max_completion_tokens, the same answer.
    parts = [
        messages[0],
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
    ]
    r2 = client.chat.completions.create(
        model="tiny", messages=parts, max_completion_tokens=12, temperature=0.7, seed=9
    )
    assert r2.choices[0].message.content == expected


def test_stop_strings_and_logprobs(llm, client):
    text = solo_text(llm, "Hello", 16, temperature=0)
    stop = text[5:7]
    r = client.completions.create(
        model="tiny", prompt="Hello", max_tokens=16, temperature=0, stop=[stop, "zzzz"]
    )
    assert r.choices[0].text == text[: text.index(stop)] and r.choices[0].finish_reason == "stop"
    r = client.completions.create(model="tiny", prompt="Hello", max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(len(t) <= 2 and v <= 0 for t, v in zip(lp.top_logprobs, lp.token_logprobs, strict=True))
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens and all(len(c.top_logprobs) == 2 for c in content)


class GoJobStats(BaseModel):
    """The seed document's job API as its Go client decodes it: these names, these types, strictly."""

    model_config = ConfigDict(strict=True)
    load_time_ms: int
    prompt_time_ms: int
    predict_time_ms: int
    total_time_ms: int


class GoJob(BaseModel):
    model_config = ConfigDict(strict=True)
    id: str
    status: Literal["pending", "running", "done", "error"]
    prompt: str
    response: str
    stats: GoJobStats


class GoJobStatus(BaseModel):
    model_config = ConfigDict(strict=True)
    id: str
    status: Literal["pending", "running", "done", "error"]
    created_at: str
    started_at: str | None
    finished_at: str | None


def test_jobs(llm, http):
    my_id = "0b6d4c0e-9d1c-4d8e-8f4e-2f7c1f0e5a11"
    prompt = "The capital of France is"
    r = http.post("/jobs", json={"id": my_id, "prompt": prompt, "max_tokens": 8, "seed": 4})
    assert r.status_code == 202 and r.json()["id"] == my_id
    assert r.json()["status"] in ("pending", "running", "done")
    # Every state decodes into the same types (the Go client polls GET /jobs/{id} too).
    early = GoJob.model_validate_json(http.get(f"/jobs/{my_id}").content)
    assert early.prompt == prompt and early.stats.load_time_ms >= 0
    deadline = time.monotonic() + 30
    while (status := GoJobStatus.model_validate_json(http.get(f"/jobs/status/{my_id}").content)).status in (
        "pending",
        "running",
    ):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert status.status == "done" and status.created_at.endswith("Z") and status.id == my_id
    assert status.started_at is not None and status.finished_at is not None
    assert status.created_at <= status.started_at <= status.finished_at
    raw = http.get(f"/jobs/{my_id}")
    job = GoJob.model_validate_json(raw.content)
    assert job.id == my_id and job.status == "done" and job.prompt == prompt
    assert job.response == solo_text(llm, prompt, 8, seed=4)
    s = job.stats
    assert s.total_time_ms >= s.prompt_time_ms + s.predict_time_ms - 2  # each rounded on its own
    assert s.total_time_ms > 0
    extra = raw.json()
    assert extra["finish_reason"] in ("stop", "length") and extra["error"] is None
    assert extra["stats"]["completion_tokens"] > 0 and extra["model"] == "tiny"
    # No id: the server makes one (a uuid). The same id again; unknown ids; bad ones.
    r = http.post("/jobs", json={"prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 202 and str(uuid.UUID(r.json()["id"])) == r.json()["id"]
    assert_error(http.post("/jobs", json={"id": my_id, "prompt": "Hi"}), 409, "already exists")
    assert_error(http.get("/jobs/does-not-exist"), 404, "no job")
    assert_error(http.get("/jobs/status/does-not-exist"), 404, "no job")
    assert_error(http.post("/jobs", json={"id": "bad id with spaces", "prompt": "Hi"}), 400, "id")
    assert_error(http.post("/jobs", json={"id": my_id + "x"}), 400, "prompt")


def test_job_store_expires_finished_jobs():
    from llamacy.scheduler import Done, GenerationRequest, Handle, Timings, Usage

    store = JobStore(ttl_s=3600, max_finished=2)
    for i in range(4):
        job = store.add(f"j{i}")
        job.handle = Handle(GenerationRequest([1]), 0, lambda ev: None)
        done = Done("stop", "x", [], Usage(1, 0, 0), Timings(0, 0, 0, 0, 0, 0), 0)
        job.handle._emit(done)
        job.closing(0, done)  # what the event loop's answer.drive does with it
        time.sleep(0.002)
    store.add("trigger-prune")
    assert sum(store.counts().values()) == 2
    with pytest.raises(Exception, match="no job"):
        store.get("j0")
    assert store.get("j3").status == "done"
    store.ttl_s = 0
    store.add("again")
    assert sum(store.counts().values()) == 0


def test_job_shape_in_every_state():
    """Pending, failed, cancelled: the Go client's types hold whatever happened to the job."""
    from llamacy.scheduler import Done, Failed, GenerationRequest, Handle, Timings, Usage

    store = JobStore()
    finals = {
        "pending": None,
        "failed": Failed("the model produced NaN"),
        "cancelled": Done("cancelled", "par", [], Usage(3, 1, 0), Timings(1.5, 2.5, 3.5, 7.5, 0, 0), 0),
        "done": Done("length", "Paris", [], Usage(3, 2, 0), Timings(0.4, 17.379, 30.6, 48.379, 0, 0), 0),
    }
    for name, final in finals.items():
        job = store.add(name, prompt="The capital", load_ms=1234.56)
        job.handle = Handle(GenerationRequest([1]), 0, lambda ev: None)
        if final is not None:
            job.handle._emit(final)
            job.error(final) if isinstance(final, Failed) else job.closing(0, final)
        out = GoJob.model_validate(job.result_dict())
        assert out.prompt == "The capital" and out.stats.load_time_ms == 1235
    assert GoJob.model_validate(store.get("pending").result_dict()).status == "pending"
    failed = store.get("failed").result_dict()
    assert failed["status"] == "error" and failed["error"] == "the model produced NaN"
    assert store.get("cancelled").result_dict()["error"] == "cancelled"
    done = GoJob.model_validate(store.get("done").result_dict())
    assert done.response == "Paris"
    assert (done.stats.prompt_time_ms, done.stats.predict_time_ms, done.stats.total_time_ms) == (17, 31, 1283)


# ---- many clients at once ----------------------------------------------------------------------------


def test_concurrent_clients_get_their_own_answers(llm, server):
    """24 requests from 8 threads over 3 slots, mixed kinds: none lost, none mixed up."""
    prompts = ["The capital of France is", "Hello", "1 2 3 4", "Once upon a time", "Paris is", "ab ab ab"]
    cases = [
        (kind, prompts[i % len(prompts)], i)
        for i, kind in enumerate(["completion", "completion-stream", "chat", "chat-stream"] * 6)
    ]

    def expected(kind: str, prompt: str, seed: int) -> str:
        if kind.startswith("chat"):
            ids = chat_ids(llm, [{"role": "user", "content": prompt}])
            return solo_text(llm, ids, 10, temperature=1.0, seed=seed, stop=["<|im_end|>", "<|im_start|>"])
        return solo_text(llm, prompt, 10, temperature=1.0, seed=seed)

    want = [expected(*c) for c in cases]
    cli = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)

    def run(case) -> str:
        kind, prompt, seed = case
        common = dict(model="tiny", max_tokens=10, temperature=1.0, seed=seed)
        if kind == "completion":
            return cli.completions.create(prompt=prompt, **common).choices[0].text
        if kind == "completion-stream":
            return "".join(
                c.choices[0].text for c in cli.completions.create(prompt=prompt, stream=True, **common)
            )
        messages = [{"role": "user", "content": prompt}]
        if kind == "chat":
            return cli.chat.completions.create(messages=messages, **common).choices[0].message.content
        stream = cli.chat.completions.create(messages=messages, stream=True, **common)
        return "".join(c.choices[0].delta.content or "" for c in stream)

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(run, cases))
    assert got == want


# ---- bad requests ------------------------------------------------------------------------------------


def test_bad_requests(llm, server, http):
    def post(path: str, body, **kw) -> httpx.Response:
        return http.post(path, content=body, headers={"content-type": "application/json"}, **kw)

    assert_error(post("/v1/completions", b'{"prompt": "x",'), 400, "not valid JSON")
    assert_error(post("/v1/completions", b"[1, 2]"), 400, "JSON object")
    assert_error(http.post("/v1/completions", json={"prompt": "x", "max_tokens": "5"}), 400, "max_tokens")
    assert_error(http.post("/v1/completions", json={"prompt": "x", "temperature": "hot"}), 400, "temperature")
    assert_error(http.post("/v1/completions", json={"prompt": "x", "temperature": 500}), 400, "temperature")
    assert_error(http.post("/v1/completions", json={"prompt": 12}), 400, "prompt")
    assert_error(http.post("/v1/completions", json={"max_tokens": 5}), 400, "missing required field: prompt")
    assert_error(http.post("/v1/completions", json={"prompt": "x", "n": 0}), 400, "n")
    assert_error(http.post("/v1/completions", json={"prompt": "x", "n": 129}), 400, "n")
    assert_error(http.post("/jobs", json={"prompt": "x", "n": 2}), 400, "n=2")
    assert_error(http.post("/v1/completions", json={"prompt": "x", "stream_options": {}}), 400, "stream")
    assert_error(http.post("/v1/completions", json={"prompt": "x", "logit_bias": {"a": 1}}), 400, "token id")
    assert_error(http.post("/v1/completions", json={"prompt": "x", "logit_bias": {"1": 101}}), 400, "logit")
    assert_error(
        http.post("/v1/completions", json={"prompt": "x", "logit_bias": {"999999": 1}}), 400, "vocab"
    )
    assert_error(http.post("/v1/completions", json={"prompt": "x", "max_tokens": -1}), 400, "max_tokens")
    assert_error(http.post("/v1/completions", json={"prompt": [1, 10**7]}), 400, "vocabulary")
    assert_error(http.post("/v1/chat/completions", json={"messages": []}), 400, "messages")
    assert_error(
        http.post("/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "x"}]}),
        400,
        "role",
    )
    assert_error(
        http.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
        ),
        400,
        "tools",
    )
    assert_error(http.post("/v1/completions", json={"prompt": "x", "stop": ["s"] * 17}), 400, "at most 16")
    assert_error(http.post("/v1/completions", json={"prompt": "x", "stop": "s" * 1000}), 400, "at most 256")
    image = [{"type": "image_url", "image_url": {"url": "x"}}]
    assert_error(
        http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": image}]}),
        400,
        "text",
    )
    assert_error(http.post("/v1/completions", json={"prompt": "x", "logprobs": 50}), 400, "logprobs")
    err = assert_error(http.post("/v1/completions", json={"prompt": "word " * 200}), 400, "context")
    assert err["code"] == "context_length_exceeded"
    assert_error(http.get("/v1/nothing"), 404, "no such endpoint")
    assert_error(http.get("/v1/completions"), 405)
    # Bodies over 1 MiB: announced by Content-Length, or streamed without one.
    big = b'{"prompt": "' + b"x" * (1 << 20) + b'"}'
    assert_error(post("/v1/completions", big), 413, "larger than")
    assert_error(post("/v1/completions", iter([big[:1000], big[1000:]])), 413, "larger than")
    # The openai client sees the error type it expects.
    cli = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="n"):
        cli.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], n=0)


def test_api_key(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        r = httpx.get(server.url + "/v1/models", headers=headers)
        assert_error(r, 401, "API key")
    assert_error(httpx.post(server.url + "/jobs", json={"prompt": "x"}), 401)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    assert httpx.get(server.url + "/health").status_code == 200


def test_full_queue_answers_429(llm):
    # A scheduler that is not started holds every request in its queue: the second one finds it full.
    with running_server(llm, start=False, queue_size=1) as (srv, sched):
        results: list = []
        first = threading.Thread(
            target=lambda: results.append(
                httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
            )
        )
        first.start()
        deadline = time.monotonic() + 10
        while sched.queue_depth < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = httpx.post(
            srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
        )
        err = assert_error(r, 429, "queue is full")
        assert r.headers["Retry-After"] == "1" and err["type"] == "rate_limit_error"
        assert_error(httpx.post(srv.url + "/jobs", json={"prompt": "x"}), 429)
        assert httpx.get(srv.url + "/health").status_code == 503  # nothing is generating
        sched.shutdown()  # the queued request fails cleanly
        first.join(10)
        assert_error(results[0], 503, "shutting down")


class SlowScheduler(Scheduler):
    def step(self) -> None:
        time.sleep(0.01)  # 100 steps/s at most: a client has time to leave mid-generation
        super().step()


def test_client_disconnect_frees_the_sequence(llm):
    with running_server(llm, SlowScheduler, parallel=1) as (srv, sched):
        body = {"prompt": "Hello", "max_tokens": 100, "ignore_eos": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json={**body, "stream": True}) as r:
            next(r.iter_lines())  # the first token arrived: the request holds the slot
            assert sched.n_active == 1
        # Without streaming: send the request on a raw socket and hang up.
        host, port = srv.url.removeprefix("http://").split(":")
        raw = json.dumps(body).encode()
        with socket.create_connection((host, int(port))) as s:
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw)
            )
            deadline = time.monotonic() + 10
            while sched.n_active == 0 and sched.finished_total.get("cancelled", 0) < 1:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            time.sleep(0.05)
        deadline = time.monotonic() + 10
        while sched.finished_total.get("cancelled", 0) < 2 or sched.n_active:
            assert time.monotonic() < deadline, sched.finished_total
            time.sleep(0.01)
        assert sched.generated_tokens_total < 150  # both stopped well before their 100 tokens
        # The slot serves the next client.
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 3}, timeout=30)
        assert r.status_code == 200


# ---- the command and the default model ---------------------------------------------------------------


@pytest.mark.slow
def test_serve_command(tiny_path):
    env = {**os.environ, "LLAMACY_API_KEY": "k"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llamacy",
            "serve",
            "-m",
            str(tiny_path),
            "--port",
            "0",
            "--parallel",
            "2",
            "--threads",
            "1",
            "--ctx-size",
            "64",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=default_sigint,  # stopped with SIGINT below, whatever runs this test
    )
    try:
        line = proc.stderr.readline()
        assert "http://127.0.0.1:" in line, line
        url = line.split(" at ")[1].split()[0].removesuffix("/v1")
        assert httpx.get(url + "/health", timeout=10).json()["status"] == "ok"
        r = httpx.post(
            url + "/v1/completions",
            json={"prompt": "Hi", "max_tokens": 2},
            headers={"Authorization": "Bearer k"},
            timeout=30,
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 2
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, proc.stderr.read()
    assert proc.stdout.read() == ""


@pytest.mark.model
def test_default_model_end_to_end(default_model_path):
    from llamacy import Llama

    llm = Llama(default_model_path, n_ctx=256, n_threads=2)
    with running_server(llm, parallel=2) as (srv, _sched):
        cli = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        messages = [{"role": "user", "content": "What is the capital of France?"}]

        def ask(_: int) -> str:
            r = cli.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
            return r.choices[0].message.content

        with ThreadPoolExecutor(2) as pool:
            a, b = pool.map(ask, range(2))
        alone = ask(0)
        assert (
            a == b == alone == solo_text(llm, chat_ids(llm, messages), 12, temperature=0, stop=["<|im_end|>"])
        )
        r = cli.completions.create(
            model="tiny", prompt="The capital of France is", max_tokens=4, temperature=0
        )
        assert "Paris" in r.choices[0].text


def test_models_registry_with_the_tiny_model(tiny_path, tmp_path):
    """The multi-model path without real models: load on first use, a file that cannot load is a 500
    naming it (the others still answer), an unknown name a 404 listing the known ones."""
    from llamacy.server import ModelLoader, ModelRegistry, ModelSpec

    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    specs = [ModelSpec("tiny", str(tiny_path)), ModelSpec("broken", str(broken))]
    registry = ModelRegistry(specs, ModelLoader(n_ctx=64, n_threads=1, n_parallel=1, queue_size=4))
    try:
        with ServerThread(create_app(registry)) as srv:
            models = httpx.get(srv.url + "/v1/models").json()["data"]
            assert [(m["id"], m["loaded"]) for m in models] == [("tiny", False), ("broken", False)]
            r = httpx.post(srv.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=30)
            assert r.status_code == 200 and r.json()["model"] == "tiny"
            assert registry.is_loaded("tiny") and not registry.is_loaded("broken")
            r = httpx.post(srv.url + "/v1/completions", json={"model": "broken", "prompt": "Hi"}, timeout=30)
            assert assert_error(r, 500, "model 'broken' could not be loaded")["code"] == "model_load_failed"
            r = httpx.post(srv.url + "/v1/completions", json={"model": "nope", "prompt": "Hi"}, timeout=30)
            assert assert_error(r, 404, "known models: tiny, broken")["code"] == "model_not_found"
            # Every dialect: several models served, an unknown name is a 404 in that dialect's shape.
            msgs = [{"role": "user", "content": "Hi"}]
            r = httpx.post(srv.url + "/api/chat", json={"model": "nope", "messages": msgs}, timeout=30)
            assert r.status_code == 404 and "known models: tiny, broken" in r.json()["error"]
            body = {"model": "nope", "max_tokens": 2, "messages": msgs}
            r = httpx.post(srv.url + "/v1/messages", json=body, timeout=30)
            assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
            assert r.headers["request-id"].startswith("req_")
            r = httpx.post(srv.url + "/v1/embeddings", json={"model": "nope", "input": "a"}, timeout=30)
            assert assert_error(r, 404, "known models: tiny, broken")["code"] == "model_not_found"
    finally:
        registry.close()
    assert not registry.loaded()
