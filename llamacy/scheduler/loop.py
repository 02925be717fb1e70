"""The Scheduler: its public API (any thread) and the scheduler thread, which admits requests into free
slots and runs steps: plan (plan.py), evaluate, apply (apply.py)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from llamacy.errors import UsageError, require_range
from llamacy.generation import SequenceState, check_prompt
from llamacy.generation.speculate import ModelDrafter, NgramDrafter, same_vocabulary
from llamacy.kernels.parallel import rest as rest_workers
from llamacy.sampling import Sampler
from llamacy.scheduler.apply import cancelled_in_queue, final_event, verify
from llamacy.scheduler.plan import Running, plan_step, shift_context
from llamacy.scheduler.requests import (
    MAX_LOGPROBS,
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

DEFAULT_PREFILL_CHUNK = 64
SOLO_PREFILL_CHUNK = 256  # prompt tokens per step when nothing decodes: the Model's micro-batch
_RATE_WINDOW_S = 10.0  # generation tokens/s is measured over this trailing window


class Scheduler:
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
        if prefill_chunk < 1:
            raise UsageError(f"the prefill chunk must be at least 1 token, got {prefill_chunk}")
        self.n_ctx = n_ctx or llm.n_ctx  # per sequence
        self.n_ctx_train = llm.config.n_ctx_train
        if not 1 <= self.n_ctx <= self.n_ctx_train:
            raise UsageError(
                f"--ctx-size must be between 1 and the model's trained context of {self.n_ctx_train}, "
                f"got {self.n_ctx}"
            )
        self.n_parallel = n_parallel
        self.n_threads = n_threads or llm.n_threads
        self.queue_size = queue_size
        self.prefill_chunk = prefill_chunk
        self.tokenizer = llm.tokenizer
        self.gguf, self.arch = llm.gguf, llm.config.arch  # a slot file names its model (memory_file.py)
        self.n_vocab = llm.n_vocab
        self.eog_ids = frozenset(llm.tokenizer.eot_ids)
        # Our own Model over llm's bound weights: a KV cache laid out for n_parallel sequences, and scratch
        # that this thread alone uses. (llm builds its single-sequence Model only if its own API is used.)
        self.model = llm.new_model(self.n_ctx, self.n_threads, n_seq=n_parallel, ubatch=SOLO_PREFILL_CHUNK)
        # The draft model's Model of one sequence: a sequence drafts only in the steps it has alone (plan.py),
        # so the sequences take turns in its cache, each keeping the prefix it shares with the last one.
        self.draft_model = None
        self.draft_name = draft.model_path.name if draft is not None else None
        if draft is not None:
            same_vocabulary(llm, draft, draft.model_path.name)
            n_draft_ctx = min(self.n_ctx, draft.config.n_ctx_train)
            self.draft_model = draft.new_model(n_draft_ctx, self.n_threads)
        self._solo_chunk = max(prefill_chunk, SOLO_PREFILL_CHUNK)

        self._cond = threading.Condition()
        self._pending: deque[tuple[Handle, Sampler]] = deque()  # guarded by _cond
        # Work on one slot's memory (save, restore, erase), run on this thread while the slot is free.
        self._tasks: deque[tuple[int, Callable, Future]] = deque()  # guarded by _cond
        self._closing = False  # guarded by _cond
        self._thread: threading.Thread | None = None
        # Owned by the scheduler thread.
        self._active: dict[int, Running] = {}  # slot -> sequence
        self._free: list[int] = list(range(n_parallel))
        self._last_used = [0.0] * n_parallel
        # Counters for metrics (ints/floats: reads from other threads see a recent value, no tear).
        self.n_active = 0
        self.prompt_tokens_total = 0  # prompt tokens of admitted requests
        self.prompt_evaluated_total = 0  # of those, evaluated (the rest came from a slot's cache)
        self.generated_tokens_total = 0
        self.draft_tokens_total = 0  # speculative decoding: tokens drafted, and of those, accepted
        self.draft_accepted_total = 0
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
        check_prompt(request.prompt, self.n_ctx, self.n_vocab, self.n_ctx_train)
        if request.max_tokens is not None:
            require_range("max_tokens", request.max_tokens, 0)
        if request.logprobs is not None:
            require_range("logprobs", request.logprobs, 0, MAX_LOGPROBS)
        if request.slot is not None:
            require_range("id_slot", request.slot, 0, self.n_parallel - 1)
        # Built now so that bad sampling options fail here and the seed is known from the start.
        spec = request.speculate
        if spec is not None and spec.mode == "draft" and self.draft_model is None:
            raise UsageError('speculate "draft" needs a draft model, and this one has none (--draft-model)')
        sampler = Sampler(request.params, self.n_vocab)
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

    def slots(self) -> list[dict]:
        """Each slot as GET /slots shows it (read from another thread: a recent view)."""
        kv = self.model.kv
        active = dict(self._active)
        return [
            {
                "id": i,
                "id_task": -1 if i not in active else active[i].handle.id,
                "n_ctx": self.n_ctx,
                "speculative": False,
                "is_processing": i in active,
                "n_tokens": kv.length(i),
            }
            for i in range(self.n_parallel)
        ]

    def add_step_hook(self, hook: Callable[[], None]) -> None:
        """Call hook() on the scheduler thread after each step's events have gone to their listeners (and
        after the final failures at shutdown): a listener that batches events for another thread (the
        server's event loop) hands them over there, one wake-up per step instead of one per event."""
        self._step_hooks.append(hook)

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

    def _admit_locked(self) -> list[Running]:
        """Give free slots to waiting requests, oldest first (called with _cond held). A request pinned to
        a slot that is busy, or has work queued on it, waits in its place."""
        admitted = []
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
            admitted.append(self._start(handle, sampler))
        self._pending.extendleft(reversed(waiting))
        # Requests cancelled while waiting leave the queue now rather than when a slot frees up.
        if any(h.cancelled for h, _ in self._pending):
            for entry in [e for e in self._pending if e[0].cancelled]:
                self._pending.remove(entry)
                self._finish_unstarted(entry[0])
        return admitted

    def _start(self, handle: Handle, sampler: Sampler) -> Running:
        req = handle.request
        prompt = req.prompt
        kv = self.model.kv

        # The free slot that can keep the longest prefix of the prompt (what its memory can go back to:
        # memory.best_cut); else the least recently used one, so that recent conversations keep their
        # cache longest.
        def kept(s: int) -> int:
            return kv.best_cut(s, min(kv.common_prefix(s, prompt), len(prompt) - 1))

        slot = (
            req.slot
            if req.slot is not None
            else max(self._free, key=lambda s: (kept(s), -self._last_used[s]))
        )
        self._free.remove(slot)
        keep = kv.reuse_prefix(slot, prompt)
        handle.started_at = time.time()
        stop_ids = (
            frozenset() if req.ignore_eos else req.stop_ids if req.stop_ids is not None else self.eog_ids
        )
        state = SequenceState(
            prompt,
            sampler,
            self.tokenizer,
            req.stop,
            stop_ids,
            req.max_tokens,
            req.logprobs,
            constraint=req.constraint,
        )
        self.prompt_tokens_total += len(prompt)
        self.prompt_evaluated_total += len(prompt) - keep
        return Running(handle, slot, keep, state, self._drafter(req, sampler))

    def _drafter(self, req: GenerationRequest, sampler: Sampler) -> NgramDrafter | ModelDrafter | None:
        spec = req.speculate
        if spec is None or req.constraint is not None:  # a grammar forces what it can already
            return None
        if spec.mode == "draft":
            # Its own random stream (as the Session's drafter): the draft's draws must not change the target's.
            seed = (sampler.seed * 0x9E3779B97F4A7C15 + 1) % 2**64
            return ModelDrafter(self.draft_model, spec, sampler.params, seed)
        return NgramDrafter(spec)

    def _finish_unstarted(self, handle: Handle) -> None:
        self._count("cancelled")
        handle._emit(cancelled_in_queue(handle))

    def _drop_cancelled(self) -> None:
        for seq in [s for s in self._active.values() if s.handle.cancelled]:
            self._finish(seq, "cancelled")

    def _step(self) -> None:
        """One batch: plan it, evaluate it, apply its results."""
        kv = self.model.kv
        for s in self._active.values():
            if s.handle.request.shift_keep is not None and not s.prefilling:
                shift_context(s, kv)
        plan = plan_step(self._active.values(), kv, self.prefill_chunk, self._solo_chunk)
        try:
            logits = self.model.eval_batch(*plan.arrays())
        except Exception as e:  # the cache of these sequences is now undefined: fail them, keep serving
            log.exception("batch evaluation failed")
            for s in plan.sequences:
                kv.clear(s.slot)
                self._fail(s, f"evaluation failed: {e}")
            return
        self.steps_total += 1
        if self.n_threads > 1:
            # Sampling and handing out text come next (a millisecond or more, on this thread, holding the
            # GIL): the team's workers would spin through it on cores the event loop needs.
            rest_workers()
        plan.record(kv)
        n_generated = 0
        row = 0
        for s, n_rows in zip(plan.owners, plan.n_rows, strict=True):
            row += n_rows
            self.draft_tokens_total += n_rows - 1
            try:
                step, n_tokens, accepted = verify(s, logits[row - n_rows : row], kv)
            except Exception as e:  # e.g. NaN logits: this sequence only
                log.exception("sampling failed for request %s", s.handle.id)
                self._fail(s, f"sampling failed: {e}")
                continue
            n_generated += n_tokens
            self.draft_accepted_total += accepted
            if step.finish_reason is not None:
                self._finish(s, step.finish_reason)
        self.generated_tokens_total += n_generated
        now = time.perf_counter()
        self._recent.append((now, n_generated))
        while self._recent and now - self._recent[0][0] > _RATE_WINDOW_S:
            self._recent.popleft()

    def _finish(self, s: Running, reason: str) -> None:
        done = final_event(s, reason)
        self._release(s)
        self._count(reason)
        s.handle._emit(done)

    def _fail(self, s: Running, message: str, shutdown: bool = False) -> None:
        self._release(s)
        self._count("error")
        s.handle._emit(Failed(message, shutdown))

    def _count(self, reason: str) -> None:
        self.finished_total[reason] = self.finished_total.get(reason, 0) + 1

    def _release(self, s: Running) -> None:
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
        for h, _ in pending:
            h._emit(Failed(message, shutdown=True))
        with self._cond:
            tasks, self._tasks = list(self._tasks), deque()
        for _, _, done in tasks:
            if done.set_running_or_notify_cancel():
                done.set_exception(SchedulerClosed(message))
        self._run_step_hooks()
