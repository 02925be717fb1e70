"""The single-sequence Session is the scheduler's Batcher with one slot, stepped in the caller's thread: the
same answers as the Scheduler gives, a caller that stops early or meets an error leaves the slot usable,
and errors reach the caller as themselves."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as QT

from llamacy import Llama
from llamacy.generation.speculate import Speculation
from llamacy.sampling import SamplingParams
from llamacy.scheduler import Batcher, GenerationRequest, Scheduler

PROMPT = [5, 17, 42, 9, 3]


@pytest.fixture
def tiny(tiny_model):
    return Llama(tiny_model("llama", QT.Q8_0), n_threads=1, n_ctx=64)


def test_the_session_steps_a_one_slot_batcher(tiny):
    batcher = tiny.session.batcher
    assert isinstance(batcher, Batcher) and batcher.n_parallel == 1 and batcher.model is tiny.model
    list(tiny.generate_tokens(PROMPT, max_tokens=5, temperature=0))
    assert batcher.steps_total >= 5 and batcher.n_active == 0
    assert batcher.generated_tokens_total == len(tiny.last.tokens)


@pytest.mark.parametrize("spec", [None, dict(speculate="ngram", ngram=1, draft_max=4)])
def test_session_and_scheduler_give_the_same_tokens(tiny, spec):
    sampling = [dict(temperature=0), dict(temperature=0.8, seed=11, top_k=20)]
    for options in sampling:
        tiny.reset()
        list(tiny.generate_tokens(PROMPT, max_tokens=12, **options, **(spec or {})))
        solo = list(tiny.last.tokens)
        speculation = Speculation(ngram=1, draft_max=4) if spec else None
        with Scheduler(tiny, n_parallel=2, n_ctx=64) as sched:
            request = GenerationRequest(
                PROMPT, SamplingParams(**options), max_tokens=12, speculate=speculation
            )
            assert sched.submit(request).result(timeout=60).tokens == solo


def test_drafts_are_counted(tiny):
    # The tiny model loops, so one-token lookups draft often.
    list(tiny.generate_tokens(PROMPT, max_tokens=24, temperature=0, speculate="ngram", ngram=1))
    st = tiny.last.stats
    assert st.draft_tokens > 0 and 0 <= st.draft_accepted <= st.draft_tokens
    assert tiny.session.batcher.draft_tokens_total == st.draft_tokens


def test_a_caller_that_stops_early_leaves_the_slot_usable(tiny):
    gen = tiny.generate_tokens(PROMPT, max_tokens=20, temperature=0)
    first = [next(gen) for _ in range(3)]
    gen.close()
    assert tiny.session.batcher.n_active == 0
    # The next call goes on from what the memory holds: the prompt and the tokens evaluated so far.
    follow = PROMPT + [t for t, _ in first][:2]
    list(tiny.generate_tokens(follow, max_tokens=2, temperature=0))
    assert tiny.last.stats.prompt_evaluated == 1
    assert tiny.last.tokens[0] == first[2][0]


def test_an_evaluation_error_reaches_the_caller_as_itself(tiny, monkeypatch):
    list(tiny.generate_tokens(PROMPT, max_tokens=2, temperature=0))

    def broken(*args, **kwargs):
        raise ValueError("the kernel refused")

    with monkeypatch.context() as m:
        m.setattr(tiny.model, "eval_batch", broken)
        with pytest.raises(ValueError, match="the kernel refused"):
            list(tiny.generate_tokens([*PROMPT, 7], max_tokens=2, temperature=0))
    # The sequence's memory was undefined after the failed step: it starts over, and gives the same answer.
    assert tiny.model.kv.length(0) == 0
    list(tiny.generate_tokens(PROMPT, max_tokens=4, temperature=0))
    again = list(tiny.last.tokens)
    tiny.reset()
    list(tiny.generate_tokens(PROMPT, max_tokens=4, temperature=0))
    assert tiny.last.tokens == again and tiny.session.batcher.n_active == 0
