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
    from llamacy.scheduler import loop, plan

    seen: list[tuple[int, list[int]]] = []

    def recording(active, *args, **kwargs):
        active = list(active)
        p = plan.plan_step(active, *args, **kwargs)
        seen.append((len(active), list(p.n_rows)))
        return p

    monkeypatch.setattr(loop, "plan_step", recording)
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
