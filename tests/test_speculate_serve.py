"""Speculative decoding per request in the scheduler: a sequence alone in a step drafts and verifies in that
step; every answer equals the single-sequence one (speculating or not), and the other sequences of a batch
never wait for verification rows."""

from __future__ import annotations

import pytest

from llamacy.generation import speculate
from llamacy.generation.speculate import Speculation
from llamacy.scheduler import Scheduler
from tests.test_scheduler import PROMPTS, request, solo


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from llamacy import Llama
    from tests.model_factory import write_tiny_model

    path = write_tiny_model(tmp_path_factory.mktemp("spec") / "tiny.gguf")
    return Llama(path, n_ctx=128, n_threads=1)


@pytest.fixture
def feedback(monkeypatch):
    """Every (drafted, accepted) pair the drafters report."""
    seen: list[tuple[int, int]] = []
    original = speculate.NgramDrafter.feedback

    def record(self, drafted: int, accepted: int) -> None:
        seen.append((drafted, accepted))
        original(self, drafted, accepted)

    monkeypatch.setattr(speculate.NgramDrafter, "feedback", record)
    return seen


@pytest.mark.parametrize("prefill_chunk", [3, 64])
def test_batched_answers_with_and_without_drafts_equal_solo_answers(llm, feedback, prefill_chunk):
    spec = Speculation(ngram=1, draft_max=6)  # the tiny model loops: single-token lookups draft often
    sampling = [
        dict(temperature=0, repeat_penalty=1.1) if i % 3 else dict(temperature=0.9, seed=i) for i in range(7)
    ]
    speculating = [i % 2 == 0 for i in range(7)]
    expected = []
    for p, s, on in zip(PROMPTS, sampling, speculating, strict=True):
        extra = {"speculate": "ngram", "ngram": 1, "draft_max": 6} if on else {}
        expected.append(solo(llm, p, 24, **s, **extra))
    assert any(accepted for _, accepted in feedback)  # the solo runs did verify drafts
    feedback.clear()
    with Scheduler(llm, n_parallel=3, n_ctx=128, prefill_chunk=prefill_chunk) as sched:
        handles = [
            sched.submit(request(llm, p, 24, **s, speculate=spec if on else None))
            for p, s, on in zip(PROMPTS, sampling, speculating, strict=True)
        ]
        results = [h.result(timeout=120) for h in handles]
        assert sched.n_active == 0 and sched.queue_depth == 0
    # (The batched ones draft only while alone in a step: test_drafts_only_when_alone_in_the_step.)
    for (toks, text), done in zip(expected, results, strict=True):
        assert done.tokens == toks
        assert done.text == text
        assert done.usage.completion_tokens == len(toks)


def test_greedy_batched_drafts_equal_plain_decoding(llm):
    """Greedy: a speculating request's answer is the plain one, token for token, in a batch with others."""
    plain = [solo(llm, p, 24, temperature=0) for p in PROMPTS[:4]]
    with Scheduler(llm, n_parallel=4, n_ctx=128) as sched:
        handles = [
            sched.submit(request(llm, p, 24, temperature=0, speculate=Speculation(ngram=1)))
            for p in PROMPTS[:4]
        ]
        results = [h.result(timeout=120) for h in handles]
    assert [d.tokens for d in results] == [toks for toks, _ in plain]
    assert [d.text for d in results] == [text for _, text in plain]


# -- the HTTP request field, with the real OpenAI client ------------------------------------------------------


def test_openai_requests_speculate_per_request(llm):
    import openai

    from tests.test_server import running_server, solo_text

    with running_server(llm) as (srv, _sched):
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
        prompt = "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"
        r = client.completions.create(
            model="tiny",
            prompt=prompt,
            max_tokens=24,
            temperature=0,
            extra_body={"speculate": "ngram", "draft_max": 4, "ngram": 1},
        )
        assert r.choices[0].text == solo_text(llm, prompt, 24, temperature=0)
        chat = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=16,
            seed=3,
            extra_body={"speculate": "ngram"},
        )
        assert chat.choices[0].finish_reason in ("stop", "length")
        for body, fragment in [
            ({"speculate": "beam"}, "speculate"),
            ({"speculate": "ngram", "draft_max": 0}, "draft_max"),
            ({"draft_max": 4}, "go with speculate"),
        ]:
            with pytest.raises(openai.BadRequestError, match=fragment):
                client.completions.create(model="tiny", prompt="Hi", max_tokens=2, extra_body=body)


# -- llamacy batch ---------------------------------------------------------------------------------------------


def test_batch_items_and_defaults_speculate(llm, tmp_path):
    import json

    from tests.test_cli import llamacy

    items = tmp_path / "in.jsonl"
    prompts = ["1 2 3 4 5 6 7 8 9 10", "the the the the", "Hello"]
    lines = [
        {"id": 0, "prompt": prompts[0], "speculate": "ngram", "ngram": 1},
        {"id": 1, "prompt": prompts[1]},
    ]
    lines.append({"id": 2, "prompt": prompts[2], "speculate": "ngram", "draft_max": 0})
    items.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "out.jsonl"
    r = llamacy(
        "batch", str(items), "-o", str(out), "-m", str(llm.model_path), "-n", "16", "--temp", "0", "-t", "1",
        "--speculate", "ngram", "--draft-max", "8",
    )  # fmt: skip
    results = {x["id"]: x for x in map(json.loads, out.read_text().splitlines())}
    assert "draft_max" in results[2]["error"], r.stderr  # a bad item fails alone, in one line
    for i in (0, 1):
        assert results[i]["completion"] == solo_text_of(llm, prompts[i])


def solo_text_of(llm, prompt: str) -> str:
    return "".join(llm.generate(prompt, max_tokens=16, temperature=0))


def test_drafts_only_when_alone_in_the_step(llm, monkeypatch):
    """Verification rows would make every other sequence of the batch wait: a speculating sequence drafts
    only in steps that hold nobody else."""
    from llamacy.scheduler import batcher, plan

    seen: list[tuple[int, list[int]]] = []

    def recording(active, *args, **kwargs):
        active = list(active)
        p = plan.plan_step(active, *args, **kwargs)
        seen.append((len(active), list(p.n_rows)))
        return p

    monkeypatch.setattr(batcher, "plan_step", recording)
    spec = Speculation(ngram=1)
    with Scheduler(llm, n_parallel=2, n_ctx=128) as sched:
        long = sched.submit(request(llm, PROMPTS[2], 40, temperature=0, speculate=spec, ignore_eos=True))
        short = sched.submit(request(llm, PROMPTS[5], 6, temperature=0, ignore_eos=True))
        results = [long.result(timeout=120), short.result(timeout=120)]
    assert all(rows == [1] * len(rows) for n, rows in seen if n > 1)
    assert any(max(rows, default=1) > 1 for n, rows in seen if n == 1)  # alone, it drafted
    monkeypatch.undo()
    with Scheduler(llm, n_parallel=1, n_ctx=128) as sched:
        plain = sched.submit(request(llm, PROMPTS[2], 40, temperature=0, ignore_eos=True)).result(timeout=120)
    assert results[0].tokens == plain.tokens


# -- a draft model in the scheduler and the server (serve --draft-model, speculate: "draft") ----------------------


@pytest.fixture(scope="module")
def drafts(tmp_path_factory, llm):
    """Two drafters for the tiny model: itself (always right) and another random model of its vocabulary."""
    from llamacy import Llama
    from tests.model_factory import write_tiny_model

    other = write_tiny_model(tmp_path_factory.mktemp("draft") / "other.gguf", seed=7)
    return {
        "self": Llama(llm.model_path, n_ctx=128, n_threads=1),
        "other": Llama(other, n_ctx=128, n_threads=1),
    }


@pytest.fixture
def model_feedback(monkeypatch):
    seen: list[tuple[int, int]] = []
    original = speculate.ModelDrafter.feedback

    def record(self, drafted: int, accepted: int) -> None:
        seen.append((drafted, accepted))
        original(self, drafted, accepted)

    monkeypatch.setattr(speculate.ModelDrafter, "feedback", record)
    return seen


@pytest.mark.parametrize("which", ["self", "other"])
def test_greedy_answers_with_a_draft_model_equal_plain_decoding(llm, drafts, model_feedback, which):
    """Alone and four at once (a sequence drafts in the steps it has alone): token for token the plain
    answers, whether the drafts are all accepted (the model itself) or mostly rejected (another one)."""
    plain = [solo(llm, p, 24, temperature=0) for p in PROMPTS[:4]]
    spec = Speculation("draft", draft_max=4, draft_model=which)
    with Scheduler(llm, n_parallel=4, n_ctx=128, draft=drafts[which]) as sched:
        alone = sched.submit(request(llm, PROMPTS[0], 24, temperature=0, speculate=spec)).result(timeout=120)
        handles = [sched.submit(request(llm, p, 24, temperature=0, speculate=spec)) for p in PROMPTS[:4]]
        results = [h.result(timeout=120) for h in handles]
    assert alone.tokens == plain[0][0] and alone.text == plain[0][1]
    assert [d.tokens for d in results] == [toks for toks, _ in plain]
    assert [d.text for d in results] == [text for _, text in plain]
    assert any(drafted for drafted, _ in model_feedback)  # it did draft
    if which == "self":
        assert all(accepted == drafted for drafted, accepted in model_feedback)


def test_sampled_answers_with_a_draft_model_equal_the_sessions(llm, drafts):
    """Sampled with a seed: the scheduler's drafting and verification are the single-sequence session's,
    so a request alone gets the answer `run --speculate draft` gives."""
    spec = Speculation("draft", draft_max=4, draft_model="other")
    path = drafts["other"].model_path
    want = solo(
        llm, PROMPTS[1], 20, temperature=0.9, seed=5, speculate="draft", draft_max=4, draft_model=path
    )
    with Scheduler(llm, n_parallel=2, n_ctx=128, draft=drafts["other"]) as sched:
        done = sched.submit(request(llm, PROMPTS[1], 20, temperature=0.9, seed=5, speculate=spec)).result(120)
    assert (done.tokens, done.text) == want


def test_a_scheduler_without_a_draft_model_refuses_draft_requests(llm):
    from llamacy.errors import UsageError

    with Scheduler(llm, n_parallel=1, n_ctx=128) as sched, pytest.raises(UsageError, match="--draft-model"):
        sched.submit(request(llm, "Hi", 4, speculate=Speculation("draft", draft_model="x")))


def test_openai_requests_speculate_with_the_servers_draft_model(llm, drafts):
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    import openai

    from llamacy.chat_template import ChatTemplate
    from llamacy.server import ServerSettings, ServerThread, create_app
    from tests.test_server import running_server, solo_text

    sched = Scheduler(llm, n_parallel=3, n_ctx=128, n_threads=1, draft=drafts["other"]).start()
    tpl = ChatTemplate.from_model(llm.metadata, llm.tokenizer)
    srv = ServerThread(create_app(sched, tpl, ServerSettings(model_name="tiny"))).start()
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)

        def ask(prompt: str) -> str:
            r = client.completions.create(
                model="tiny", prompt=prompt, max_tokens=16, temperature=0, extra_body={"speculate": "draft"}
            )
            return r.choices[0].text

        assert ask(PROMPTS[0]) == solo_text(llm, PROMPTS[0], 16, temperature=0)
        metrics = httpx.get(srv.url + "/metrics", timeout=30).text  # alone in its steps, it drafted
        drafted = [line for line in metrics.splitlines() if line.startswith("llamacy_draft_tokens_total{")]
        assert drafted and float(drafted[0].rsplit(" ", 1)[1]) == sched.draft_tokens_total > 0
        with ThreadPoolExecutor(6) as pool:  # under concurrent load: the same answers
            answers = list(pool.map(ask, PROMPTS[:6]))
        assert answers == [solo_text(llm, p, 16, temperature=0) for p in PROMPTS[:6]]
        with pytest.raises(openai.BadRequestError, match="ngram"):
            client.completions.create(
                model="tiny", prompt="Hi", max_tokens=2, extra_body={"speculate": "draft", "ngram": 2}
            )
    finally:
        sched.shutdown()
        srv.stop()
    with running_server(llm) as (srv, _sched):  # no draft model: a 400 that says how to get one
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError, match="--draft-model"):
            client.completions.create(
                model="tiny", prompt="Hi", max_tokens=2, extra_body={"speculate": "draft"}
            )


def test_serve_takes_a_draft_model_for_one_model(llm, drafts):
    from llamacy.server.loading import ModelLoader
    from llamacy.server.models import ModelSpec
    from tests.test_cli import assert_one_line_error, llamacy

    path = str(drafts["other"].model_path)
    served = ModelLoader(n_ctx=64, n_threads=1, n_parallel=2, draft_model=path)(
        ModelSpec("t", str(llm.model_path))
    )
    try:
        assert served.scheduler.draft_name == "other.gguf" and served.scheduler.draft_model is not None
    finally:
        served.scheduler.shutdown()
    r = llamacy("serve", "-m", str(llm.model_path), "-m", path, "--draft-model", path, "--port", "0")
    assert_one_line_error(r, 2, "--draft-model goes with one model")


def test_batch_drafts_with_a_draft_model(llm, drafts, tmp_path):
    import json

    from tests.test_cli import assert_one_line_error, llamacy

    items = tmp_path / "in.jsonl"
    prompts = ["1 2 3 4 5 6 7 8 9 10", "the the the the", "Hello", "a b c"]
    lines = [{"id": i, "prompt": p} for i, p in enumerate(prompts)]
    lines[3]["speculate"] = "ngram"  # an item may choose otherwise
    items.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "out.jsonl"
    path = str(drafts["other"].model_path)
    r = llamacy(
        "batch", str(items), "-o", str(out), "-m", str(llm.model_path), "-n", "16", "--temp", "0", "-t", "1",
        "--speculate", "draft", "--draft-model", path, "--draft-max", "4",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    results = {x["id"]: x for x in map(json.loads, out.read_text().splitlines())}
    assert [results[i]["completion"] for i in range(4)] == [solo_text_of(llm, p) for p in prompts]
    r = llamacy("batch", str(items), "-o", str(tmp_path / "x.jsonl"), "--speculate", "draft", "--ray", "auto")
    assert_one_line_error(r, 2, "prompt lookup only")
    r = llamacy("batch", str(items), "-o", str(tmp_path / "y.jsonl"), "--speculate", "draft")
    assert_one_line_error(r, 2, "--draft-model")


# -- `llamacy serve --draft-model` as a process: a layer-truncated draft, concurrent streaming clients ------------


def _stream_completion(url: str, prompt: str, max_tokens: int, draft: bool) -> str:
    import json

    import httpx

    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if draft:
        body["speculate"] = "draft"
    text = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text.extend(c["text"] for c in json.loads(line[6:])["choices"])
    return "".join(text)


def _draft_metrics(url: str) -> tuple[int, int]:
    import re

    import httpx

    text = httpx.get(url + "/metrics", timeout=10).text
    drafted = re.search(r"^llamacy_draft_tokens_total\{[^}]*\} (\d+)$", text, re.M)
    accepted = re.search(r"^llamacy_draft_accepted_total\{[^}]*\} (\d+)$", text, re.M)
    assert drafted and accepted, text
    return int(drafted.group(1)), int(accepted.group(1))


@pytest.mark.slow
def test_serve_command_with_a_truncated_draft_under_concurrent_load(tmp_path):
    """benchmarks/make_draft.py cuts a model to its first blocks (a draft of its vocabulary); `llamacy serve
    --draft-model` with it answers six concurrent streaming greedy requests that end one by one exactly as
    the same requests without drafting, and /metrics counts the drafts, some of them accepted (alone: the
    same counts every time)."""
    import os
    import signal
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from llamacy import Llama
    from tests.conftest import default_sigint
    from tests.model_factory import write_tiny_model
    from tests.test_server import solo_text

    target = write_tiny_model(tmp_path / "target.gguf", n_layer=4, seed=3)
    draft = tmp_path / "draft.gguf"
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "make_draft.py"
    env = {**os.environ, "PYTHONPATH": str(script.parent.parent)}
    made = subprocess.run(
        [sys.executable, script, target, "3", draft], capture_output=True, text=True, env=env
    )
    assert made.returncode == 0 and "blocks 3 of 4" in made.stdout, made.stderr
    assert Llama(draft, n_ctx=64, n_threads=1).config.n_layer == 3
    bad = subprocess.run(
        [sys.executable, script, target, "4", tmp_path / "x.gguf"], capture_output=True, text=True, env=env
    )
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1 and "keep 1 to 3" in bad.stderr, bad.stderr

    cmd = [sys.executable, "-m", "llamacy", "serve", "-m", target, "--draft-model", draft, "--parallel", "3"]
    cmd += ["--threads", "1", "--ctx-size", "128", "--port", "0", "--host", "127.0.0.1"]
    env.pop("LLAMACY_API_KEY", None)
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
                            preexec_fn=default_sigint)  # fmt: skip
    try:
        line = proc.stderr.readline()
        assert " at http://127.0.0.1:" in line, line
        url = line.split(" at ")[1].split()[0].removesuffix("/v1")
        lengths = [30, 25, 20, 15, 10, 5]  # they end one by one: the last ones are alone, and draft

        def answers(draft: bool) -> list[str]:
            with ThreadPoolExecutor(6) as pool:
                return list(pool.map(lambda p, n: _stream_completion(url, p, n, draft), PROMPTS[:6], lengths))

        plain = answers(False)
        assert _draft_metrics(url) == (0, 0)
        assert answers(True) == plain
        # Under load, how many tokens are drafted (only while a sequence is alone) and which of them the
        # target accepts depend on when the others end: only that the last one alone drafted is certain.
        counts = [_draft_metrics(url)]
        assert counts[0][0] > 0
        for _ in range(2):  # alone, the same request drafts and accepts the same tokens every time
            assert _stream_completion(url, PROMPTS[0], 30, True) == plain[0]
            counts.append(_draft_metrics(url))
        (d0, a0), (d1, a1), (d2, a2) = counts
        assert d2 - d1 == d1 - d0 > 0 and a2 - a1 == a1 - a0 > 0, counts
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    llm = Llama(target, n_ctx=128, n_threads=1)
    assert plain == [solo_text(llm, p, n, temperature=0) for p, n in zip(PROMPTS, lengths, strict=False)]
