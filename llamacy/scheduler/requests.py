"""What a client of the scheduler sees: the request, the events it produces, and the Handle to follow or
cancel it. Nothing here runs generation."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from queue import SimpleQueue
from typing import Any

from llamacy.errors import LlamacyError
from llamacy.generation.steps import TokenLogprob
from llamacy.sampling import SamplingParams

log = logging.getLogger("llamacy.scheduler")

MAX_LOGPROBS = 20  # alternatives per token, as OpenAI's top_logprobs


class QueueFull(LlamacyError):
    """The request queue is full; try again later (HTTP 429)."""


class SchedulerClosed(LlamacyError):
    """The scheduler has been shut down and accepts no more requests."""


# ---- requests and events ---------------------------------------------------------------------------


@dataclass
class GenerationRequest:
    prompt: list[int]  # token ids, BOS included if the model wants one
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None  # None: until a stop or the sequence's context is full
    stop: Sequence[str] = ()  # stop strings (never part of the output)
    stop_ids: frozenset[int] | None = None  # None: the tokenizer's end-of-generation ids
    ignore_eos: bool = False  # keep going through stop ids (benchmarks: a fixed number of tokens)
    logprobs: int | None = None  # None: off; k >= 0: the sampled token's logprob and k alternatives
    id: str | None = None  # None: a fresh uuid
    # A llamacy.structured.Constraint, owned by this request alone: its grammar masks this sequence's logits
    # only, so constrained and unconstrained requests share batches.
    constraint: Any = None
    # A llamacy.generation.speculate.Speculation: this sequence drafts tokens by prompt lookup and verifies
    # them in the step's batch (ignored under a constraint). Other sequences' results are unchanged.
    speculate: Any = None
    # The slot (sequence) to run in, llama-server's id_slot: a restored slot is continued by the request
    # that names it (it waits for the slot if it is busy). None: the scheduler picks one.
    slot: int | None = None
    # Context shift (llamacy/generation/shift.py): when the sequence fills its context, keep its first
    # shift_keep tokens and the newer half of the rest, evaluate the kept ones again and go on. None: off.
    shift_keep: int | None = None


@dataclass
class Piece:
    """Generated text, safe to show: whole UTF-8 characters, no part of a possible stop string.
    `tokens` are the ids generated since the previous piece (text can lag a token or two behind)."""

    text: str
    tokens: list[int]
    logprobs: list[TokenLogprob] | None = None
    final: bool = False  # the text held back to the end (a possible stop string, an incomplete character)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens whose K/V were reused from the slot's previous request


@dataclass(frozen=True)
class Timings:
    queue_ms: float  # submit -> a slot was free
    prompt_ms: float  # prefill: slot -> the first token's logits
    predict_ms: float  # first token's logits -> finish
    total_ms: float  # submit -> finish (queue + prompt + predict)
    prompt_tokens_per_second: float  # evaluated prompt tokens / prompt time
    tokens_per_second: float  # completion tokens / predict time

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self.__dict__.items()}


@dataclass
class Done:
    """The last event of a request. finish_reason: "stop" (a stop id or string), "length" (max_tokens
    or the context), "cancelled". text/tokens: the whole completion."""

    finish_reason: str
    text: str
    tokens: list[int]
    usage: Usage
    timings: Timings
    seed: int  # the seed the sampler used (drawn at random when the request gave none)
    stop_string: str | None = None  # the stop string that ended the text (None: a stop id, the length)


@dataclass
class Failed:
    """The last event of a request that could not finish (an error in the model, a shutdown)."""

    message: str
    shutdown: bool = False  # the scheduler stopped: the request itself was fine, retry elsewhere/later


Event = Piece | Done | Failed


class Handle:
    """One submitted request: its events, its state, and a way to cancel it. Thread-safe.

    Events go to `listener` (called on the scheduler thread; it must be quick and not raise) when one was
    given to submit, otherwise into a queue that events() reads.
    """

    def __init__(
        self,
        request: GenerationRequest,
        seed: int,
        listener: Callable[[Event], None] | None,
        wake: Callable[[], None] | None = None,
    ) -> None:
        """seed: the one the request's sampler uses; wake: called on cancel (the scheduler's thread waits
        for news)."""
        self.id = request.id or uuid.uuid4().hex
        self.request = request
        self.seed = seed
        self.prompt_tokens = len(request.prompt)
        self.created_at = time.time()
        self.started_at: float | None = None  # a slot was assigned
        self.finished_at: float | None = None
        self.final: Done | Failed | None = None
        self.t_created = time.perf_counter()  # the same moment on the clock that durations are measured on
        self._cancelled = threading.Event()
        self._finished = threading.Event()
        self._queue: SimpleQueue[Event] | None = None if listener else SimpleQueue()
        self._listener = listener
        self._wake = wake

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    def cancel(self) -> None:
        """Stop generating (e.g. the client went away); the slot is freed at the next step."""
        if not self._finished.is_set():
            self._cancelled.set()
            if self._wake is not None:
                self._wake()

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Events as they come, ending with Done or Failed. `timeout`: the longest wait for one event."""
        if self._queue is None:
            raise RuntimeError("this request's events go to its listener")
        while True:
            ev = self._queue.get(timeout=timeout)
            yield ev
            if isinstance(ev, Done | Failed):
                return

    def result(self, timeout: float | None = None) -> Done:
        """Wait for the end; return Done, or raise LlamacyError for Failed."""
        if not self._finished.wait(timeout):
            raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
        if isinstance(self.final, Failed):
            raise LlamacyError(self.final.message)
        assert isinstance(self.final, Done)
        return self.final

    def _emit(self, ev: Event) -> None:
        if isinstance(ev, Done | Failed):
            self.final = ev
            self.finished_at = time.time()
        try:
            if self._listener is not None:
                self._listener(ev)
            else:
                assert self._queue is not None
                self._queue.put(ev)
        except Exception:  # a consumer's bug must not stop the other sequences
            log.exception("event listener of request %s failed", self.id)
        if isinstance(ev, Done | Failed):
            self._finished.set()
