"""Continuous batching: many generation requests share one model, one batch per step.

    sched = Scheduler(llm, n_parallel=4)          # llm: a loaded llamacy.Llama (gguf, config, tokenizer)
    sched.start()
    handle = sched.submit(GenerationRequest(prompt=llm.tokenize("Hi"), max_tokens=16))
    for event in handle.events():                 # Piece(text, tokens, ...) ..., then Done or Failed
        ...
    sched.shutdown()

One scheduler thread owns a separate Model with `n_parallel` sequences (each its own slice of the KV cache)
and runs steps. A step is ONE call to Model.eval_batch holding the next token of every decoding sequence
plus a chunk of prompt tokens of the oldest prefilling sequences (chunked prefill: a long prompt costs the
others at most `prefill_chunk` extra tokens per step). Each weight row is then read once for every
sequence in the batch, which is where the throughput of serving many clients comes from.

New requests join between steps; a finished or cancelled sequence frees its slot at the next step. A free
slot keeps the tokens it last held, so a new prompt that shares their prefix (a chat that goes on, a
common system prompt) skips evaluating it.

Every request samples with its own seeded Sampler and the layer loop computes each batch row
independently of the others, so a request's tokens are the same whether it ran alone or batched.
Nothing here knows about HTTP: the server and `llamacy batch` both build on it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any

import numpy as np

from llamacy.errors import ContextOverflowError, LlamacyError, UsageError
from llamacy.kernels.parallel import rest as rest_workers
from llamacy.sampling import Sampler, SamplingParams
from llamacy.stopping import StopMatcher

if TYPE_CHECKING:
    from llamacy.engine import Llama

log = logging.getLogger("llamacy.scheduler")

DEFAULT_PREFILL_CHUNK = 64
MAX_LOGPROBS = 20  # alternatives per token, as OpenAI's top_logprobs
_SOLO_PREFILL_CHUNK = 256  # the Model's default micro-batch
_RATE_WINDOW_S = 10.0  # generation tokens/s is measured over this trailing window


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


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float  # log-softmax of the model's raw logits (before penalties and temperature)
    top: list[tuple[int, float]]  # the k most likely (token, logprob), best first


@dataclass
class Piece:
    """Generated text, safe to show: whole UTF-8 characters, no part of a possible stop string.
    `tokens` are the ids generated since the previous piece (text can lag a token or two behind)."""

    text: str
    tokens: list[int]
    logprobs: list[TokenLogprob] | None = None


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
        self, request: GenerationRequest, seed: int, listener: Callable[[Event], None] | None
    ) -> None:
        self.id = request.id or uuid.uuid4().hex
        self.request = request
        self.seed = seed
        self.prompt_tokens = len(request.prompt)
        self.created_at = time.time()
        self.started_at: float | None = None  # a slot was assigned
        self.finished_at: float | None = None
        self.final: Done | Failed | None = None
        self._t_created = time.perf_counter()
        self._cancelled = threading.Event()
        self._finished = threading.Event()
        self._queue: SimpleQueue[Event] | None = None if listener else SimpleQueue()
        self._listener = listener
        self._wake: Callable[[], None] = lambda: None  # set by the scheduler: cancel wakes it
        self._sampler: Sampler | None = None  # set by the scheduler; owned by its thread once started

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


# ---- one running sequence ----------------------------------------------------------------------------


class _Seq:
    """A request that holds a slot: its prompt progress and generation state."""

    def __init__(
        self,
        handle: Handle,
        slot: int,
        cached: int,
        sampler: Sampler,
        tokenizer: Any,
        eog_ids: frozenset[int],
    ) -> None:
        req = handle.request
        self.handle = handle
        self.slot = slot
        self.prompt = req.prompt
        self.cached = cached  # prompt tokens reused from the slot's cache
        self.n_prompt_done = cached  # prompt tokens whose K/V are in the cache
        self.sampler = sampler
        self.history = list(req.prompt)  # what the penalties look at
        self.stop_ids: frozenset[int] = (
            frozenset() if req.ignore_eos else req.stop_ids if req.stop_ids is not None else eog_ids
        )
        self.decoder = tokenizer.stream_decoder()
        self.stops = StopMatcher(list(req.stop))
        self.next_token: int | None = None  # sampled, evaluated at the next step
        self.tokens: list[int] = []
        self.text: list[str] = []
        self.unsent: list[int] = []  # tokens not yet reported in a Piece
        self.unsent_lp: list[TokenLogprob] = []
        self.t_start = time.perf_counter()
        self.t_first: float | None = None  # when the prompt was done

    @property
    def prefilling(self) -> bool:
        return self.next_token is None


def _logprobs(row: np.ndarray, token: int, k: int) -> TokenLogprob:
    x = row.astype(np.float64)
    mx = x.max()
    lse = mx + np.log(np.exp(x - mx).sum())
    top: list[tuple[int, float]] = []
    if k > 0:
        k = min(k, len(x))
        ids = np.argpartition(-x, k - 1)[:k]
        ids = ids[np.lexsort((ids, -x[ids]))]  # best first, ties by id
        top = [(int(i), float(x[i] - lse)) for i in ids]
    return TokenLogprob(token, float(x[token] - lse), top)


# ---- the scheduler -----------------------------------------------------------------------------------


class Scheduler:
    """Runs generation requests in parallel sequences of one model (see the module docstring)."""

    def __init__(
        self,
        llm: Llama,
        n_parallel: int = 4,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        queue_size: int = 64,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    ) -> None:
        from llamacy.model import Model

        if n_parallel < 1:
            raise UsageError(f"--parallel must be at least 1, got {n_parallel}")
        if queue_size < 1:
            raise UsageError(f"--queue-size must be at least 1, got {queue_size}")
        if prefill_chunk < 1:
            raise UsageError(f"the prefill chunk must be at least 1 token, got {prefill_chunk}")
        self.n_ctx = n_ctx or llm.n_ctx  # per sequence
        if not 1 <= self.n_ctx <= llm.config.n_ctx_train:
            raise UsageError(
                f"--ctx-size must be between 1 and the model's trained context of {llm.config.n_ctx_train}, "
                f"got {self.n_ctx}"
            )
        self.n_parallel = n_parallel
        self.n_threads = n_threads or llm.n_threads
        self.queue_size = queue_size
        self.prefill_chunk = prefill_chunk
        self.tokenizer = llm.tokenizer
        self.n_vocab = llm.n_vocab
        self.eog_ids = frozenset(llm.tokenizer.eot_ids)
        # A Model of our own: llm.model keeps serving llm's single-sequence API, and our cache is laid out
        # for n_parallel sequences. The weights are the same memory-mapped file.
        self.model = Model(
            llm.gguf,
            n_ctx=self.n_ctx,
            n_threads=self.n_threads,
            n_seq=n_parallel,
            cfg=llm.config,
            kv_type=llm.kv_type,
        )
        # When nothing is decoding there is nobody to stall: prefill in the Model's full micro-batches.
        self._solo_chunk = max(prefill_chunk, _SOLO_PREFILL_CHUNK)

        self._cond = threading.Condition()
        self._pending: deque[Handle] = deque()  # guarded by _cond
        self._closing = False  # guarded by _cond
        self._thread: threading.Thread | None = None
        # Owned by the scheduler thread.
        self._active: dict[int, _Seq] = {}  # slot -> sequence
        self._free: list[int] = list(range(n_parallel))
        self._last_used = [0.0] * n_parallel
        # Counters for metrics (ints/floats: reads from other threads see a recent value, no tear).
        self.n_active = 0
        self.prompt_tokens_total = 0  # prompt tokens of admitted requests
        self.prompt_evaluated_total = 0  # of those, evaluated (the rest came from a slot's cache)
        self.generated_tokens_total = 0
        self.steps_total = 0
        self.finished_total: dict[str, int] = {}
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens generated in that step)
        self._step_hooks: list[Callable[[], None]] = []

    # ---- public API (any thread) --------------------------------------------------------------------

    def start(self) -> Scheduler:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="llamacy-scheduler", daemon=True)
                self._thread.start()
        return self

    def __enter__(self) -> Scheduler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def alive(self) -> bool:
        """The scheduler thread is running (started, not shut down, not crashed)."""
        return self._thread is not None and self._thread.is_alive() and not self._closing

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    def submit(self, request: GenerationRequest, listener: Callable[[Event], None] | None = None) -> Handle:
        """Queue a request. Raises UsageError/ContextOverflowError for a request that can never run,
        QueueFull when the queue is full, SchedulerClosed after shutdown."""
        prompt = request.prompt
        if not prompt:
            raise UsageError("the prompt is empty (no tokens)")
        if len(prompt) >= self.n_ctx:
            raise ContextOverflowError(
                f"the prompt has {len(prompt)} tokens but a sequence's context holds {self.n_ctx} "
                f"(raise --ctx-size or shorten the prompt)"
            )
        if min(prompt) < 0 or max(prompt) >= self.n_vocab:
            raise UsageError(f"the prompt holds token ids outside the vocabulary [0, {self.n_vocab})")
        if request.max_tokens is not None and request.max_tokens < 0:
            raise UsageError(f"max_tokens must be at least 0, got {request.max_tokens}")
        if request.logprobs is not None and not 0 <= request.logprobs <= MAX_LOGPROBS:
            raise UsageError(f"logprobs must be between 0 and {MAX_LOGPROBS}, got {request.logprobs}")
        # Built now so that bad sampling options fail here and the seed is known from the start.
        sampler = Sampler(request.params, self.n_vocab)
        handle = Handle(request, sampler.seed, listener)
        handle._sampler = sampler
        handle._wake = self._wake
        with self._cond:
            if self._closing:
                raise SchedulerClosed("the scheduler is shut down")
            if len(self._pending) >= self.queue_size:
                raise QueueFull(f"the queue is full ({self.queue_size} requests waiting); retry later")
            self._pending.append(handle)
            self._cond.notify()
        return handle

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop the thread after its current step; unfinished requests end with Failed."""
        with self._cond:
            self._closing = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        else:  # never started: fail whatever was queued
            self._fail_all("the server is shutting down")

    def add_step_hook(self, hook: Callable[[], None]) -> None:
        """Call hook() on the scheduler thread after each step's events have gone to their listeners (and
        after the final failures at shutdown): a listener that batches events for another thread (the
        server's event loop) hands them over there, one wake-up per step instead of one per event."""
        self._step_hooks.append(hook)

    def _run_step_hooks(self) -> None:
        for hook in list(self._step_hooks):
            try:
                hook()
            except Exception:  # a consumer's bug must not stop the other sequences
                log.exception("step hook failed")

    def tokens_per_second(self) -> float:
        """Generated tokens per second over the last few seconds (all sequences together)."""
        recent = list(self._recent)
        now = time.perf_counter()
        n = sum(k for t, k in recent if now - t <= _RATE_WINDOW_S)
        return n / _RATE_WINDOW_S if recent else 0.0

    # ---- the scheduler thread -----------------------------------------------------------------------

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    # Sleep while there is nothing to do: no busy-waiting when idle.
                    while not self._closing and not self._pending and not self._active:
                        self._cond.wait()
                    if self._closing:
                        break
                    admitted = self._admit_locked()
                for seq in admitted:
                    self._active[seq.slot] = seq
                self.n_active = len(self._active)
                self._drop_cancelled()
                if self._active:
                    self._step()
                self._run_step_hooks()
        except BaseException:  # a bug here must not leave clients waiting forever
            log.exception("scheduler thread crashed")
            with self._cond:
                self._closing = True
            raise
        finally:
            self._fail_all("the server is shutting down")

    def _admit_locked(self) -> list[_Seq]:
        """Give free slots to waiting requests, oldest first (called with _cond held)."""
        admitted = []
        while self._pending and self._free:
            handle = self._pending.popleft()
            if handle.cancelled:
                self._finish_unstarted(handle)
                continue
            admitted.append(self._start(handle))
        # Requests cancelled while waiting leave the queue now rather than when a slot frees up.
        if any(h.cancelled for h in self._pending):
            for h in [h for h in self._pending if h.cancelled]:
                self._pending.remove(h)
                self._finish_unstarted(h)
        return admitted

    def _start(self, handle: Handle) -> _Seq:
        prompt = handle.request.prompt
        kv = self.model.kv
        # The free slot sharing the longest prefix with the prompt; else the least recently used one, so
        # that recent conversations keep their cache longest.
        slot = max(self._free, key=lambda s: (kv.common_prefix(s, prompt), -self._last_used[s]))
        self._free.remove(slot)
        keep = kv.common_prefix(slot, prompt)
        if keep == len(prompt):
            keep -= 1  # the last prompt token is evaluated again: its logits are not stored
        kv.truncate(slot, keep)
        handle.started_at = time.time()
        assert handle._sampler is not None
        seq = _Seq(handle, slot, keep, handle._sampler, self.tokenizer, self.eog_ids)
        self.prompt_tokens_total += len(prompt)
        self.prompt_evaluated_total += len(prompt) - keep
        return seq

    def _finish_unstarted(self, handle: Handle) -> None:
        usage = Usage(handle.prompt_tokens, 0, 0)
        ms = (time.perf_counter() - handle._t_created) * 1000
        self.finished_total["cancelled"] = self.finished_total.get("cancelled", 0) + 1
        handle._emit(Done("cancelled", "", [], usage, Timings(ms, 0, 0, ms, 0, 0), handle.seed))

    def _drop_cancelled(self) -> None:
        for seq in [s for s in self._active.values() if s.handle.cancelled]:
            self._finish(seq, "cancelled")

    def _step(self) -> None:
        """One batch: a token for every decoding sequence, then prompt chunks, oldest request first."""
        kv = self.model.kv
        tokens: list[int] = []
        pos: list[int] = []
        seqs: list[int] = []
        rows: list[int] = []
        owners: list[_Seq] = []  # the sequence of each row in `rows`
        decoding = [s for s in self._active.values() if not s.prefilling]
        prefilling = sorted((s for s in self._active.values() if s.prefilling), key=lambda s: s.t_start)
        for s in decoding:
            rows.append(len(tokens))
            owners.append(s)
            tokens.append(s.next_token)  # type: ignore[arg-type]
            pos.append(kv.length(s.slot))
            seqs.append(s.slot)
        budget = self.prefill_chunk if decoding else self._solo_chunk
        chunks: list[tuple[_Seq, list[int]]] = []
        for s in prefilling:
            if budget <= 0:
                break
            chunk = s.prompt[s.n_prompt_done : s.n_prompt_done + budget]
            budget -= len(chunk)
            chunks.append((s, chunk))
            tokens.extend(chunk)
            pos.extend(range(s.n_prompt_done, s.n_prompt_done + len(chunk)))
            seqs.extend([s.slot] * len(chunk))
            if s.n_prompt_done + len(chunk) == len(s.prompt):
                rows.append(len(tokens) - 1)
                owners.append(s)

        in_batch = decoding + [s for s, _ in chunks]
        try:
            logits = self.model.eval_batch(
                np.asarray(tokens, np.int32),
                np.asarray(pos, np.int32),
                np.asarray(seqs, np.int32),
                np.asarray(rows, np.int32),
            )
        except Exception as e:  # the cache of these sequences is now undefined: fail them, keep serving
            log.exception("batch evaluation failed")
            for s in in_batch:
                kv.clear(s.slot)
                self._fail(s, f"evaluation failed: {e}")
            return
        self.steps_total += 1
        if self.n_threads > 1:
            # Sampling and handing out text come next (a millisecond or more, on this thread, holding the
            # GIL): the team's workers would spin through it on cores the event loop needs.
            rest_workers()
        for s in decoding:
            kv.tokens[s.slot].append(s.next_token)  # type: ignore[arg-type]
        for s, chunk in chunks:
            kv.tokens[s.slot].extend(chunk)
            s.n_prompt_done += len(chunk)
        n_generated = 0
        for row, s in enumerate(owners):
            if s.t_first is None:
                s.t_first = time.perf_counter()
            try:
                n_generated += self._advance(s, logits[row])
            except Exception as e:  # e.g. NaN logits: this sequence only
                log.exception("sampling failed for request %s", s.handle.id)
                self._fail(s, f"sampling failed: {e}")
        self.generated_tokens_total += n_generated
        now = time.perf_counter()
        self._recent.append((now, n_generated))
        while self._recent and now - self._recent[0][0] > _RATE_WINDOW_S:
            self._recent.popleft()

    def _advance(self, s: _Seq, row: np.ndarray) -> int:
        """Sample the next token of s from its logits row; emit text; finish s if it is done.
        Returns the number of tokens generated (0 or 1)."""
        req = s.handle.request
        if req.max_tokens is not None and len(s.tokens) >= req.max_tokens:  # max_tokens = 0
            self._finish(s, "length")
            return 0
        tok = s.sampler.sample(row, s.history)
        if tok in s.stop_ids:
            self._finish(s, "stop")
            return 0
        s.tokens.append(tok)
        s.history.append(tok)
        s.unsent.append(tok)
        if req.logprobs is not None:
            s.unsent_lp.append(_logprobs(row, tok, req.logprobs))
        piece = s.stops.feed(s.decoder.feed(tok))
        if piece:
            s.text.append(piece)
            self._send(s, piece)
        if s.stops.stopped:
            self._finish(s, "stop")
        elif (req.max_tokens is not None and len(s.tokens) >= req.max_tokens) or (
            self.model.kv.length(s.slot) >= self.n_ctx
        ):
            self._finish(s, "length")
        else:
            s.next_token = tok
        return 1

    def _send(self, s: _Seq, text: str) -> None:
        lp = s.unsent_lp if s.handle.request.logprobs is not None else None
        s.handle._emit(Piece(text, s.unsent, lp))
        s.unsent, s.unsent_lp = [], []

    def _finish(self, s: _Seq, reason: str) -> None:
        if reason != "cancelled" and not s.stops.stopped:
            # Text held back as a possible stop string or an incomplete character is released now.
            tail = s.stops.feed(s.decoder.flush()) + s.stops.flush()
            if tail:
                s.text.append(tail)
            if tail or s.unsent:
                self._send(s, tail)
        elif s.unsent and reason != "cancelled":
            self._send(s, "")
        now = time.perf_counter()
        h = s.handle
        t_first = s.t_first or now
        prompt_s = t_first - s.t_start
        predict_s = now - t_first
        n_eval = len(s.prompt) - s.cached
        timings = Timings(
            queue_ms=(s.t_start - h._t_created) * 1000,
            prompt_ms=prompt_s * 1000,
            predict_ms=predict_s * 1000,
            total_ms=(now - h._t_created) * 1000,
            prompt_tokens_per_second=n_eval / prompt_s if prompt_s > 0 else 0.0,
            tokens_per_second=len(s.tokens) / predict_s if predict_s > 0 else 0.0,
        )
        usage = Usage(len(s.prompt), len(s.tokens), s.cached)
        self._release(s)
        self.finished_total[reason] = self.finished_total.get(reason, 0) + 1
        h._emit(Done(reason, "".join(s.text), s.tokens, usage, timings, h.seed, s.stops.matched))

    def _fail(self, s: _Seq, message: str, shutdown: bool = False) -> None:
        self._release(s)
        self.finished_total["error"] = self.finished_total.get("error", 0) + 1
        s.handle._emit(Failed(message, shutdown))

    def _release(self, s: _Seq) -> None:
        if self._active.pop(s.slot, None) is s:
            self._free.append(s.slot)
            self._last_used[s.slot] = time.perf_counter()
        # The slot's cache keeps what it holds (even a half-done prompt is a valid prefix) for reuse.
        self.n_active = len(self._active)

    def _fail_all(self, message: str) -> None:
        for s in list(self._active.values()):
            self._fail(s, message, shutdown=True)
        with self._cond:
            pending, self._pending = list(self._pending), deque()
        for h in pending:
            h._emit(Failed(message, shutdown=True))
        self._run_step_hooks()
