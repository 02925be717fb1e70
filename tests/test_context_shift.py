"""Prompts longer than the context (issue #28): with --context-shift a conversation drops its oldest turns,
never its system prompt, and keeps answering; without it the answer is the 400 that names the sizes."""

from __future__ import annotations

import httpx
import pytest

from llamacy.server.context_shift import fit_messages, truncate_prompt
from tests.test_server import running_server

SYSTEM = {"role": "system", "content": "Be brief."}


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from llamacy import Llama
    from tests.model_factory import write_tiny_model

    return Llama(write_tiny_model(tmp_path_factory.mktemp("shift") / "tiny.gguf"), n_ctx=128, n_threads=1)


def _chat(c: httpx.Client, messages: list[dict]) -> httpx.Response:
    return c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "temperature": 0})


def test_ten_turns_far_beyond_the_context_keep_answering_with_the_system_prompt(llm):
    from llamacy.chat_template import ChatTemplate

    tpl = ChatTemplate.from_model(llm.metadata, llm.tokenizer)
    with (
        running_server(llm, parallel=1, context_shift=True) as (srv, _),
        httpx.Client(base_url=srv.url, timeout=30) as c,
    ):
        messages = [SYSTEM]
        for turn in range(10):
            messages.append({"role": "user", "content": f"turn {turn}: tell me more about it"})
            r = _chat(c, messages)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["prompt_tokens"] <= 128 - 32
            messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
        whole = tpl.encode(tpl.render(messages, add_generation_prompt=True))
        assert len(whole) > 3 * 128  # the conversation is far beyond the context
    encode = lambda m: (None, tpl.encode(tpl.render(m, add_generation_prompt=True)))  # noqa: E731
    kept, _, ids = fit_messages(messages, encode, 128)
    assert kept[0] == SYSTEM and kept[1]["role"] == "user" and kept[-1] == messages[-1]
    assert len(ids) <= 96 and len(kept) < len(messages)
    with running_server(llm, parallel=1) as (srv, _), httpx.Client(base_url=srv.url, timeout=30) as c:
        r = _chat(c, messages)
        assert r.status_code == 400
        msg = r.json()["error"]["message"]
        assert (
            "tokens but the context holds 128" in msg
            and r.json()["error"]["code"] == "context_length_exceeded"
        )


def test_plain_prompts_keep_their_first_tokens_and_their_end(llm):
    ids = list(range(300))
    got = truncate_prompt(ids, 128, 10)
    assert len(got) < 128 and got[:10] == ids[:10] and got[-1] == 299
    assert truncate_prompt(ids[:100], 128, 10) == ids[:100]
    with (
        running_server(llm, parallel=1, context_shift=True, keep=4) as (srv, _),
        httpx.Client(base_url=srv.url, timeout=30) as c,
    ):
        r = c.post("/v1/completions", json={"prompt": ids[3:250], "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] < 128


def test_responses_truncation_auto_per_request(llm):
    with running_server(llm, parallel=1) as (srv, _), httpx.Client(base_url=srv.url, timeout=30) as c:
        long = [{"role": "user", "content": f"turn {i}: a long message about many things"} for i in range(12)]
        body = {"input": long, "instructions": "Be brief.", "max_output_tokens": 4, "temperature": 0}
        assert c.post("/v1/responses", json=body).status_code == 400
        r = c.post("/v1/responses", json={**body, "truncation": "auto"})
        assert r.status_code == 200, r.text
        assert r.json()["truncation"] == "auto" and r.json()["usage"]["input_tokens"] < 128


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_generation_goes_on_past_a_full_context_with_an_exact_cache(tmp_path, arch):
    """`run --context-shift`: a full context keeps its first --keep tokens and the newer half of the rest,
    and the kept tokens are evaluated again: the cache then holds what a fresh evaluation of them gives."""
    import numpy as np
    from gguf import GGMLQuantizationType as QT

    from llamacy import Llama
    from llamacy.model import Model
    from tests.model_factory import write_tiny_model

    path = write_tiny_model(tmp_path / f"{arch}.gguf", arch=arch, wtype=QT.Q8_0, n_ctx=256)
    prompt = "hello there, how are you"
    plain = Llama(path, n_ctx=64, n_threads=1, kv_type="f32", n_batch=8)
    list(plain.generate_tokens(prompt, max_tokens=150, temperature=0))
    short = plain.last.tokens
    assert plain.last.finish_reason == "length" and len(plain.last.tokens) < 64
    llm = Llama(path, n_ctx=64, n_threads=1, kv_type="f32", n_batch=8)
    ids = llm.tokenize(prompt)
    list(llm.generate_tokens(prompt, max_tokens=150, temperature=0, context_shift=True, keep=4))
    st = llm.last.stats
    assert len(llm.last.tokens) == 150 and st.context_shifts >= 2, llm.last.finish_reason
    assert llm.last.tokens[: len(short)] == short  # the same until the first shift
    kv = llm.model.kv
    assert kv.tokens[0][:4] == ids[:4] and kv.length(0) <= 64
    fresh = Model(llm.gguf, 64, 1, ubatch=8, cfg=llm.config, kv_type="f32", weights=llm.weights)
    want = fresh.eval([*kv.tokens[0], 7], logits="last")
    np.testing.assert_array_equal(llm.model.eval([7], logits="last"), want)


def test_run_context_shift_flag(tmp_path):
    from gguf import GGMLQuantizationType as QT

    from tests.model_factory import write_tiny_model
    from tests.test_cli import llamacy

    path = write_tiny_model(tmp_path / "t.gguf", arch="llama", wtype=QT.Q8_0)
    r = llamacy("run", "hello", "-m", str(path), "-c", "32", "-n", "80", "--temp", "0", "-t", "1",
                "--context-shift", "--keep", "2", "-v")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "generated 80 tok" in r.stderr.decode()


def test_scheduler_shifts_as_the_session_does(llm):
    """A served reply that fills the context goes on (serve --context-shift) with the tokens `run
    --context-shift` gives."""
    from llamacy import Llama
    from llamacy.sampling import SamplingParams
    from llamacy.scheduler import GenerationRequest, Scheduler

    prompt = llm.tokenize("hello there, how are you")
    solo = Llama(llm.model_path, n_ctx=64, n_threads=1)
    list(solo.generate_tokens(prompt, max_tokens=150, temperature=0, context_shift=True, keep=4))
    assert solo.last.stats.context_shifts >= 2 and len(solo.last.tokens) == 150
    with Scheduler(llm, n_parallel=2, n_ctx=64, n_threads=1) as sched:
        req = GenerationRequest(prompt, SamplingParams(temperature=0), max_tokens=150, shift_keep=4)
        other = sched.submit(GenerationRequest(prompt[:5], SamplingParams(temperature=0), max_tokens=40))
        done = sched.submit(req).result(timeout=120)
        other.result(timeout=120)
    assert done.tokens == solo.last.tokens and done.finish_reason == "length"
    assert done.usage.prompt_tokens == len(prompt)
    with (
        running_server(llm, parallel=1, context_shift=True, keep=4) as (srv, _),
        httpx.Client(base_url=srv.url, timeout=60) as c,
    ):
        body = {"prompt": prompt, "max_tokens": 300, "temperature": 0, "ignore_eos": True}
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 300, r.text
