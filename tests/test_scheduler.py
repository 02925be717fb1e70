"""The continuous-batching scheduler: batched answers equal solo ones, and the queue/slot bookkeeping.

The reference for every answer is Llama.generate_tokens (one sequence, no batching) with the same seed.
Tiny random models keep this fast; one thread, because on a busy 2-core machine OpenMP barriers with 2
threads can stall for seconds.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from llamacy.errors import ContextOverflowError, UsageError
from llamacy.sampling import SamplingParams
from llamacy.scheduler import (
    Done,
    Failed,
    GenerationRequest,
    Piece,
    QueueFull,
    Scheduler,
    SchedulerClosed,
)

PROMPTS = [
    "The capital of France is",
    "Hello",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    "Once upon a time in a land far away, there lived",
    "Paris",
    "the the the the",
    "ab",
]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from llamacy import Llama
    from tests.model_factory import write_tiny_model

    path = write_tiny_model(tmp_path_factory.mktemp("sched") / "tiny.gguf")
    return Llama(path, n_ctx=128, n_threads=1)


def solo(llm, prompt: str, max_tokens: int, **sampling) -> tuple[list[int], str]:
    """What the single-sequence engine generates: (token ids, text)."""
    toks, text = [], ""
    for tok, piece in llm.generate_tokens(prompt, max_tokens=max_tokens, **sampling):
        if tok >= 0:
            toks.append(tok)
        text += piece
    return toks, text


def request(llm, prompt: str, max_tokens: int = 12, **kwargs) -> GenerationRequest:
    sampling = {k: kwargs.pop(k) for k in list(kwargs) if k in SamplingParams.__dataclass_fields__}
    return GenerationRequest(
        llm.tokenize(prompt), SamplingParams(**sampling), max_tokens=max_tokens, **kwargs
    )


def test_batched_logits_equal_solo_logits(llm):
    """The property everything rests on: a row's logits do not depend on what else is in the batch."""
    from llamacy.model import Model

    m = Model(llm.gguf, n_ctx=64, n_threads=1, n_seq=3, cfg=llm.config)
    prompts = [llm.tokenize(p) for p in PROMPTS[:3]]
    alone = []
    for p in prompts:
        m.kv.clear()
        alone.append(
            m.eval_batch(np.array(p), np.arange(len(p)), np.zeros(len(p)), np.array([len(p) - 1]))[0]
        )
    m.kv.clear()
    toks = np.concatenate([np.array(p) for p in prompts])
    pos = np.concatenate([np.arange(len(p)) for p in prompts])
    seq = np.concatenate([np.full(len(p), i) for i, p in enumerate(prompts)])
    together = m.eval_batch(toks, pos, seq, np.cumsum([len(p) for p in prompts]) - 1)
    for i in range(3):
        np.testing.assert_allclose(together[i], alone[i], rtol=0, atol=1e-5)
        assert together[i].argmax() == alone[i].argmax()


def test_serving_binds_the_weights_once_and_builds_one_model(llm, monkeypatch):
    """What `llamacy serve` builds, a Llama and then a Scheduler, is one Model (one Forward, with its
    scratch) over one binding of the weights; the single-sequence Model comes only with its API's use."""
    from llamacy import Llama
    from llamacy.model import forward, weights

    built: list[int] = []
    bound: list[int] = []
    bind = weights.WeightBinder.bind

    class CountingForward(forward.Forward):
        def __init__(self, *args, **kwargs) -> None:
            built.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(forward, "Forward", CountingForward)
    monkeypatch.setattr(weights.WeightBinder, "bind", lambda self, **kw: bound.append(1) or bind(self, **kw))
    served = Llama(llm.model_path, n_ctx=128, n_threads=1)
    with Scheduler(served, n_parallel=2, n_ctx=128) as sched:
        done = sched.submit(request(served, "Hello", 4, temperature=0)).result(30)
    assert (len(built), len(bound)) == (1, 1)
    assert done.tokens == solo(served, "Hello", 4, temperature=0)[0]
    assert (len(built), len(bound)) == (2, 1)  # the single-sequence API built its Model on first use


@pytest.mark.parametrize("prefill_chunk", [3, 64])
def test_batched_outputs_equal_solo_outputs(llm, prefill_chunk):
    """7 requests over 3 slots (queueing, chunked prefill, slots reused): each answer is the solo one."""
    sampling = [dict(temperature=0.9, seed=i) for i in range(len(PROMPTS))]
    sampling[1] = dict(temperature=0)  # greedy
    sampling[2] = dict(temperature=0.7, top_k=0, top_p=0.9, min_p=0.0, seed=7, frequency_penalty=0.5)
    expected = [solo(llm, p, 12, **s) for p, s in zip(PROMPTS, sampling, strict=True)]
    with Scheduler(llm, n_parallel=3, n_ctx=128, prefill_chunk=prefill_chunk) as sched:
        handles = [sched.submit(request(llm, p, 12, **s)) for p, s in zip(PROMPTS, sampling, strict=True)]
        results = [h.result(timeout=60) for h in handles]
        assert sched.n_active == 0 and sched.queue_depth == 0
    for (toks, text), done in zip(expected, results, strict=True):
        assert done.tokens == toks
        assert done.text == text
        assert done.usage.completion_tokens == len(toks)


def test_events_stream_the_text(llm):
    with Scheduler(llm, n_parallel=2, n_ctx=128) as sched:
        h = sched.submit(request(llm, "Once upon", 20, temperature=0.8, seed=3))
        events = list(h.events(timeout=30))
    pieces = [e for e in events if isinstance(e, Piece)]
    done = events[-1]
    assert isinstance(done, Done) and all(not isinstance(e, Done | Failed) for e in events[:-1])
    assert "".join(p.text for p in pieces) == done.text
    assert [t for p in pieces for t in p.tokens] == done.tokens
    t = done.timings
    assert t.total_ms >= t.prompt_ms + t.predict_ms > 0 and t.tokens_per_second > 0
    assert done.seed == 3


def test_stop_string_and_finish_reasons(llm):
    toks, text = solo(llm, "Hello", 16, temperature=0)
    stop = text[6:8]
    assert len(stop) == 2 and text.index(stop) >= 2
    with Scheduler(llm, n_parallel=2, n_ctx=128) as sched:
        done = sched.submit(request(llm, "Hello", 16, temperature=0, stop=[stop])).result(30)
        assert done.finish_reason == "stop" and done.text == text[: text.index(stop)]
        zero = sched.submit(request(llm, "Hello", 0)).result(30)
        assert zero.finish_reason == "length" and zero.tokens == [] and zero.text == ""
        # A stop id: the first greedy token, so nothing is generated.
        first = GenerationRequest(
            llm.tokenize("Hello"), SamplingParams(temperature=0), 16, stop_ids=frozenset(toks[:1])
        )
        done = sched.submit(first).result(30)
        assert done.finish_reason == "stop" and done.tokens == []


def test_generation_stops_at_the_sequence_context(llm):
    prompt = llm.tokenize("1 2 3 4 5 6 7 8 9 10")
    with Scheduler(llm, n_parallel=2, n_ctx=len(prompt) + 5) as sched:
        req = GenerationRequest(prompt, SamplingParams(seed=1), max_tokens=None, ignore_eos=True)
        done = sched.submit(req).result(30)
    assert done.finish_reason == "length"
    # As the single-sequence engine: the last token is sampled from the logits of the last position.
    assert done.usage.completion_tokens == 5 + 1


def test_prompt_prefix_is_reused(llm):
    prompt = "Once upon a time in a land far away"
    toks, _ = solo(llm, prompt, 8, temperature=0.5, seed=11)
    with Scheduler(llm, n_parallel=2, n_ctx=128) as sched:
        first = sched.submit(request(llm, prompt, 8, temperature=0.5, seed=11)).result(30)
        again = sched.submit(request(llm, prompt, 8, temperature=0.5, seed=11)).result(30)
        longer = sched.submit(request(llm, prompt + " there", 8, temperature=0.5, seed=11)).result(30)
    n = len(llm.tokenize(prompt))
    assert first.usage.cached_tokens == 0 and first.tokens == toks
    assert again.usage.cached_tokens == n - 1 and again.tokens == toks
    assert longer.usage.cached_tokens >= n - 1


def test_logprobs(llm):
    with Scheduler(llm, n_parallel=1, n_ctx=128) as sched:
        h = sched.submit(request(llm, "Hello", 5, temperature=0, logprobs=3))
        events = list(h.events(timeout=30))
    lps = [lp for e in events if isinstance(e, Piece) for lp in (e.logprobs or [])]
    assert [lp.token for lp in lps] == events[-1].tokens
    for lp in lps:
        assert len(lp.top) == 3 and lp.top[0][0] == lp.token  # greedy: the sampled token is the best
        assert lp.logprob == pytest.approx(lp.top[0][1]) and lp.logprob <= 0
        assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)


def test_submit_rejects_what_can_never_run(llm):
    with Scheduler(llm, n_parallel=1, n_ctx=16) as sched:
        with pytest.raises(ContextOverflowError, match="16"):
            sched.submit(GenerationRequest(list(range(1, 17))))
        with pytest.raises(UsageError, match="empty"):
            sched.submit(GenerationRequest([]))
        with pytest.raises(UsageError, match="vocabulary"):
            sched.submit(GenerationRequest([1, 10**6]))
        with pytest.raises(UsageError, match="temperature"):
            sched.submit(GenerationRequest([1], SamplingParams(temperature=-1)))


def test_queue_full_and_shutdown_fail_pending(llm):
    sched = Scheduler(llm, n_parallel=1, n_ctx=32, queue_size=2)  # not started: requests stay queued
    handles = [sched.submit(GenerationRequest([1, 2])) for _ in range(2)]
    with pytest.raises(QueueFull):
        sched.submit(GenerationRequest([1, 2]))
    assert sched.queue_depth == 2
    sched.shutdown()
    for h in handles:
        assert isinstance(h.final, Failed) and "shutting down" in h.final.message
    with pytest.raises(SchedulerClosed):
        sched.submit(GenerationRequest([1, 2]))


class SlowScheduler(Scheduler):
    """Steps take at least 5 ms, so that a test can act while a request is running."""

    def step(self) -> None:
        time.sleep(0.005)
        super().step()


def test_cancel_frees_the_slot(llm):
    with SlowScheduler(llm, n_parallel=1, n_ctx=128) as sched:
        first_piece = threading.Event()
        events: list = []

        def listener(ev) -> None:
            events.append(ev)
            first_piece.set()

        long = GenerationRequest(llm.tokenize("Hello"), max_tokens=100, ignore_eos=True)
        h = sched.submit(long, listener)
        waiting = sched.submit(request(llm, "Hello", 3, temperature=0))  # needs the only slot
        cancelled_in_queue = sched.submit(request(llm, "Hello", 3))
        cancelled_in_queue.cancel()
        assert first_piece.wait(30)
        h.cancel()
        assert waiting.result(30).usage.completion_tokens == 3
        assert h.final.finish_reason == "cancelled" and len(h.final.tokens) < 100
        assert cancelled_in_queue.result(30).finish_reason == "cancelled"
        assert sched.finished_total["cancelled"] == 2


def test_shutdown_fails_running_requests_and_idle_does_not_spin(llm):
    sched = SlowScheduler(llm, n_parallel=1, n_ctx=128).start()
    t0 = time.process_time()
    time.sleep(0.3)
    assert time.process_time() - t0 < 0.1  # idle: the thread sleeps on its condition
    h = sched.submit(GenerationRequest(llm.tokenize("Hello"), max_tokens=100, ignore_eos=True))
    next(h.events(timeout=30))  # the request is running
    sched.shutdown()
    assert isinstance(h.final, Failed | Done)
    assert not sched._thread.is_alive()


def test_listener_errors_do_not_stop_the_scheduler(llm):
    def bad_listener(ev) -> None:
        raise RuntimeError("consumer bug")

    with Scheduler(llm, n_parallel=2, n_ctx=64) as sched:
        h = sched.submit(request(llm, "Hello", 3), bad_listener)
        assert h.result(30).usage.completion_tokens <= 3
        assert sched.submit(request(llm, "Hello", 3)).result(30).finish_reason in ("stop", "length")


def test_step_hooks_follow_every_event(llm):
    # The server's mailbox relies on this: every event a listener gets is followed, on the scheduler thread,
    # by a step-hook call (so a batch handed over per step never strands an event), shutdown included.
    log: list[str] = []
    lock = threading.Lock()

    def listener(ev) -> None:
        with lock:
            log.append("event" if not isinstance(ev, Done | Failed) else "final")

    def hook() -> None:
        with lock:
            log.append("hook")

    sched = Scheduler(llm, n_parallel=2, n_ctx=64)
    sched.add_step_hook(hook)
    sched.add_step_hook(lambda: 1 / 0)  # a broken hook is logged, not fatal
    with sched:
        handles = [sched.submit(request(llm, p, 5), listener) for p in PROMPTS[:3]]
        for h in handles:
            h.result(30)
        time.sleep(0.1)  # the hook of the last step runs right after its events
        with lock:
            assert log and log[-1] == "hook"
            assert log.count("final") == 3
    # Never started: shutdown fails the queued request on the caller's thread, then runs the hooks.
    idle = Scheduler(llm, n_parallel=1, n_ctx=64)
    idle.add_step_hook(hook)
    log.clear()
    idle.submit(request(llm, "Hello", 3), listener)
    idle.shutdown()
    assert log == ["final", "hook"]


def test_server_mailbox_hands_a_steps_events_over_in_order():
    import asyncio

    from llamacy.server.generation import LoopMailbox

    async def main() -> list[int]:
        box = LoopMailbox(asyncio.get_running_loop())
        q: asyncio.Queue = asyncio.Queue()
        flusher = threading.Thread(target=lambda: ([box.post(q, i) for i in range(5)], box.flush()))
        flusher.start()
        flusher.join()
        got = [await asyncio.wait_for(q.get(), 5) for _ in range(5)]
        box.flush()  # nothing pending: no call into the loop
        return got

    assert asyncio.run(main()) == [0, 1, 2, 3, 4]
    # A loop that has closed (the server stopped) is not an error for the scheduler thread.
    loop = asyncio.new_event_loop()
    box = LoopMailbox(loop)
    loop.close()
    box.post(asyncio.Queue(), 1)
    box.flush()
