"""The Scheduler: its public API (any thread) and the scheduler thread, which admits queued requests into
free slots and steps the Batcher (batcher.py) while any sequence is active."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from llamacy.errors import UsageError, require_range
from llamacy.generation.speculate import same_vocabulary
from llamacy.sampling import Sampler
from llamacy.scheduler.apply import cancelled_in_queue
from llamacy.scheduler.batcher import DEFAULT_PREFILL_CHUNK, SOLO_PREFILL_CHUNK, Batcher
from llamacy.scheduler.requests import (
    Event,
    Failed,
    GenerationRequest,
    Handle,
    QueueFull,
    SchedulerClosed,
    log,
)

if TYPE_CHECKING:
    from llamacy.engine import Llama

__all__ = ["DEFAULT_PREFILL_CHUNK", "Scheduler"]


class Scheduler(Batcher):
    """Runs generation requests in parallel sequences of one model (see the package docstring)."""

    def __init__(
        self,
        llm: Llama,
        n_parallel: int = 4,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        queue_size: int = 64,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        draft: Llama | None = None,
    ) -> None:
        """draft: a smaller model with the same vocabulary, for requests that speculate with mode "draft"."""
        require_range("--parallel", n_parallel, 1)
        require_range("--queue-size", queue_size, 1)
        n_ctx = n_ctx or llm.n_ctx  # per sequence
        n_ctx_train = llm.config.n_ctx_train
        if not 1 <= n_ctx <= n_ctx_train:
            raise UsageError(
                f"--ctx-size must be between 1 and the model's trained context of {n_ctx_train}, got {n_ctx}"
            )
        n_threads = n_threads or llm.n_threads
        # The draft model's Model of one sequence: a sequence drafts only in the steps it has alone (plan.py),
        # so the sequences take turns in its cache, each keeping the prefix it shares with the last one.
        draft_model = None
        if draft is not None:
            same_vocabulary(llm, draft, draft.model_path.name)
            draft_model = draft.new_model(min(n_ctx, draft.config.n_ctx_train), n_threads)
        # Our own Model over llm's bound weights: a KV cache laid out for n_parallel sequences, and scratch
        # that this thread alone uses. (llm builds its single-sequence Model only if its own API is used.)
        super().__init__(
            llm.new_model(n_ctx, n_threads, n_seq=n_parallel, ubatch=SOLO_PREFILL_CHUNK),
            llm.tokenizer,
            n_ctx_train,
            prefill_chunk,
            SOLO_PREFILL_CHUNK,
            draft_model=draft_model,
            rest_between_steps=True,
        )
        self.draft_name = draft.model_path.name if draft is not None else None
        self.queue_size = queue_size
        self.gguf, self.arch = llm.gguf, llm.config.arch  # a slot file names its model (memory_file.py)

        self._cond = threading.Condition()
        self._pending: deque[tuple[Handle, Sampler]] = deque()  # guarded by _cond
        # Work on one slot's memory (save, restore, erase), run on this thread while the slot is free.
        self._tasks: deque[tuple[int, Callable, Future]] = deque()  # guarded by _cond
        self._closing = False  # guarded by _cond
        self._thread: threading.Thread | None = None
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
        sampler = self.check(request)
        handle = Handle(request, sampler.seed, listener, wake=self._wake)
        with self._cond:
            if self._closing:
                raise SchedulerClosed("the scheduler is shut down")
            if len(self._pending) >= self.queue_size:
                raise QueueFull(f"the queue is full ({self.queue_size} requests waiting); retry later")
            self._pending.append((handle, sampler))
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

    def on_slot(self, slot: int, work: Callable) -> Future:
        """Run work(memory, slot) on the scheduler thread as soon as the slot is free (llama-server defers a
        slot action on a busy slot the same way); the Future has its result or its exception."""
        require_range("id_slot", slot, 0, self.n_parallel - 1)
        done: Future = Future()
        with self._cond:
            if self._closing:
                raise SchedulerClosed("the scheduler is shut down")
            self._tasks.append((slot, work, done))
            self._cond.notify()
        return done

    def add_step_hook(self, hook: Callable[[], None]) -> None:
        """Call hook() on the scheduler thread after each step's events have gone to their listeners (and
        after the final failures at shutdown): a listener that batches events for another thread (the
        server's event loop) hands them over there, one wake-up per step instead of one per event."""
        self._step_hooks.append(hook)

    # ---- the scheduler thread -----------------------------------------------------------------------

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _run_step_hooks(self) -> None:
        for hook in list(self._step_hooks):
            try:
                hook()
            except Exception:  # a consumer's bug must not stop the other sequences
                log.exception("step hook failed")

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    # Sleep while there is nothing to do: no busy-waiting when idle.
                    while not self._closing and not self._pending and not self._active and not self._tasks:
                        self._cond.wait()
                    if self._closing:
                        break
                    tasks = [t for t in self._tasks if t[0] not in self._active]
                    for t in tasks:
                        self._tasks.remove(t)
                for slot, work, done in tasks:
                    self._run_task(slot, work, done)
                with self._cond:
                    self._admit_locked()
                self.step()
                self._run_step_hooks()
        except BaseException:  # a bug here must not leave clients waiting forever
            log.exception("scheduler thread crashed")
            with self._cond:
                self._closing = True
            raise
        finally:
            self._fail_all("the server is shutting down")

    def _run_task(self, slot: int, work: Callable, done: Future) -> None:
        if not done.set_running_or_notify_cancel():
            return
        try:
            result = work(self.model.kv, slot)
        except BaseException as e:
            done.set_exception(e)
        else:
            done.set_result(result)
        self._last_used[slot] = time.perf_counter()  # a restored slot is the last one to reuse

    def _admit_locked(self) -> None:
        """Give free slots to waiting requests, oldest first (called with _cond held). A request pinned to
        a slot that is busy, or has work queued on it, waits in its place."""
        waiting: list[tuple[Handle, Sampler]] = []
        while self._pending and self._free:
            handle, sampler = self._pending.popleft()
            if handle.cancelled:
                self._finish_unstarted(handle)
                continue
            pin = handle.request.slot
            if pin is not None and (pin not in self._free or any(t[0] == pin for t in self._tasks)):
                waiting.append((handle, sampler))
                continue
            self.admit(handle, sampler)
        self._pending.extendleft(reversed(waiting))
        # Requests cancelled while waiting leave the queue now rather than when a slot frees up.
        if any(h.cancelled for h, _ in self._pending):
            for entry in [e for e in self._pending if e[0].cancelled]:
                self._pending.remove(entry)
                self._finish_unstarted(entry[0])

    def _finish_unstarted(self, handle: Handle) -> None:
        self._count("cancelled")
        handle._emit(cancelled_in_queue(handle))

    def _fail_all(self, message: str) -> None:
        self.fail_active(message)
        with self._cond:
            pending, self._pending = list(self._pending), deque()
        for h, _ in pending:
            h._emit(Failed(message, shutdown=True))
        with self._cond:
            tasks, self._tasks = list(self._tasks), deque()
        for _, _, done in tasks:
            if done.set_running_or_notify_cancel():
                done.set_exception(SchedulerClosed(message))
        self._run_step_hooks()
