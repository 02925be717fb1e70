"""Speculative decoding per request in the scheduler: drafts join the step's batch; every answer equals the
single-sequence one (speculating or not), so the other sequences of a batch are unaffected."""

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
    assert any(accepted for _, accepted in feedback)  # and so did the batched ones
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
