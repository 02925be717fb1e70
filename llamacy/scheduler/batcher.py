"""The sequences held in the slots of one Model and the step that advances them together: plan the batch
(plan.py), evaluate it, apply its results (apply.py). No thread and no queue of its own, so every front end
drives generation through it: the Scheduler (loop.py) steps it on its thread for `serve` and `batch`, and a
Session (llamacy/generation/session.py) steps one slot in its caller's thread for `run`, `chat` and the
Python API. Prefix reuse, drafting and verification, stop handling, structured output, context shift and
the checkpoint at a prompt's end are therefore the same whichever door a request came in by.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np

from llamacy.errors import UsageError, require_range
from llamacy.generation.speculate import ModelDrafter, MtpDrafter, NgramDrafter
from llamacy.generation.steps import SequenceState, check_prompt
from llamacy.kernels.parallel import rest as rest_workers
from llamacy.sampling import Sampler
from llamacy.scheduler.apply import final_event, verify
from llamacy.scheduler.plan import Running, plan_step, shift_context
from llamacy.scheduler.requests import MAX_LOGPROBS, Failed, GenerationRequest, Handle, log

DEFAULT_PREFILL_CHUNK = 64
SOLO_PREFILL_CHUNK = 256  # prompt tokens per step when nothing decodes: the Model's micro-batch
_RATE_WINDOW_S = 10.0  # generation tokens/s is measured over this trailing window


class Batcher:
    """Requests running in the sequences ("slots") of `model`, advanced one batch per step()."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        n_ctx_train: int,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        solo_chunk: int = SOLO_PREFILL_CHUNK,
        draft_model: Any = None,
        rest_between_steps: bool = False,
        timed: bool = False,
        raise_errors: bool = False,
    ) -> None:
        """model: a llamacy.model.Model with one sequence per slot. prefill_chunk: prompt tokens per step
        while other sequences decode (they wait for them); solo_chunk: while none does. draft_model: the
        Model (one sequence) that drafts for requests speculating with mode "draft"; the sequences take
        turns in its cache (a sequence drafts only in steps it has alone, plan.py). rest_between_steps: put
        the thread team to sleep after each evaluation (a server: sampling and the event loop need the
        cores); a single caller keeps them spinning for the next step. timed: time sampling and
        detokenizing (profiles). raise_errors: an evaluation or sampling error propagates to the caller of
        step() (a single caller: the error itself, not a Failed event); else it fails the sequences it
        touched and the others go on (a server)."""
        if prefill_chunk < 1:
            raise UsageError(f"the prefill chunk must be at least 1 token, got {prefill_chunk}")
        self.model = model
        self.n_ctx = model.n_ctx  # per sequence
        self.n_ctx_train = n_ctx_train
        self.n_parallel = model.kv.n_seq
        self.n_threads = model.n_threads
        self.n_vocab = model.cfg.n_vocab
        self.tokenizer = tokenizer
        self.eog_ids = frozenset(tokenizer.eot_ids)
        self.prefill_chunk = prefill_chunk
        self._solo_chunk = max(prefill_chunk, solo_chunk)
        self.draft_model = draft_model
        self._mtp: Any = None  # the model's multi-token-prediction block, once a request drafts with it
        self.rest_between_steps = rest_between_steps
        self.timed = timed
        self.raise_errors = raise_errors
        # Owned by whichever thread steps.
        self._active: dict[int, Running] = {}  # slot -> sequence
        self._free: list[int] = list(range(self.n_parallel))
        self._last_used = [0.0] * self.n_parallel
        # Counters for metrics (ints/floats: reads from other threads see a recent value, no tear).
        self.n_active = 0
        self.prompt_tokens_total = 0  # prompt tokens of admitted requests
        self.prompt_evaluated_total = 0  # of those, evaluated (the rest came from a slot's cache)
        self.generated_tokens_total = 0
        self.draft_tokens_total = 0  # speculative decoding: rows drafted, and of those, accepted
        self.draft_accepted_total = 0
        self.steps_total = 0
        self.finished_total: dict[str, int] = {}
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens generated in that step)

    def check(self, request: GenerationRequest) -> Sampler:
        """Refuse a request that can never run (UsageError/ContextOverflowError, one line), else build its
        sampler (so that bad sampling options fail now and the seed is known from the start)."""
        check_prompt(request.prompt, self.n_ctx, self.n_vocab, self.n_ctx_train)
        if request.max_tokens is not None:
            require_range("max_tokens", request.max_tokens, 0)
        if request.logprobs is not None:
            require_range("logprobs", request.logprobs, 0, MAX_LOGPROBS)
        if request.slot is not None:
            require_range("id_slot", request.slot, 0, self.n_parallel - 1)
        spec = request.speculate
        if spec is not None and spec.mode == "draft" and self.draft_model is None:
            raise UsageError('speculate "draft" needs a draft model, and this one has none (--draft-model)')
        if spec is not None and spec.mode == "mtp":
            from llamacy.model.mtp import mtp_support

            why = mtp_support(self.model)
            if why is not None:
                raise UsageError(why)
        return Sampler(request.params, self.n_vocab)

    def mtp_head(self) -> Any:
        """The model's multi-token-prediction block (model/mtp.py), bound at the first request that drafts
        with it, in the thread that steps the batches (its binding packs matrices)."""
        if self._mtp is None:
            from llamacy.model.mtp import MtpHead

            self._mtp = MtpHead(self.model)
        return self._mtp

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

    def tokens_per_second(self) -> float:
        """Generated tokens per second over the last few seconds (all sequences together)."""
        recent = list(self._recent)
        now = time.perf_counter()
        n = sum(k for t, k in recent if now - t <= _RATE_WINDOW_S)
        return n / _RATE_WINDOW_S if recent else 0.0

    # ---- admission ----------------------------------------------------------------------------------

    def admit(self, handle: Handle, sampler: Sampler) -> Running:
        """Give a free slot to a request (its pinned one, if it names one) and make it active."""
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
            timed=self.timed,
            constraint=req.constraint,
        )
        self.prompt_tokens_total += len(prompt)
        self.prompt_evaluated_total += len(prompt) - keep
        seq = Running(handle, slot, keep, state, self._drafter(req, sampler, slot))
        self._active[slot] = seq
        self.n_active = len(self._active)
        return seq

    def _drafter(
        self, req: GenerationRequest, sampler: Sampler, slot: int
    ) -> NgramDrafter | ModelDrafter | MtpDrafter | None:
        spec = req.speculate
        if spec is None or req.constraint is not None:  # a grammar forces what it can already
            return None
        # A drafter's own random stream: the draft's draws must not change the target's.
        seed = (sampler.seed * 0x9E3779B97F4A7C15 + 1) % 2**64
        if spec.mode == "draft":
            return ModelDrafter(self.draft_model, spec, sampler.params, seed)
        if spec.mode == "mtp":
            return MtpDrafter(self.mtp_head(), slot, spec, sampler.params, seed)
        return NgramDrafter(spec)

    # ---- the step -----------------------------------------------------------------------------------

    def step(self) -> None:
        """One batch over every active sequence: plan it, evaluate it, apply its results (events go to the
        requests' handles). Cancelled sequences end first."""
        for seq in [s for s in self._active.values() if s.handle.cancelled]:
            self._finish(seq, "cancelled")
        if not self._active:
            return
        kv = self.model.kv
        for s in self._active.values():
            if s.handle.request.shift_keep is not None and not s.prefilling:
                shift_context(s, kv)
        plan = plan_step(self._active.values(), kv, self.prefill_chunk, self._solo_chunk)
        # The sequences drafting with the model's own prediction block read the hidden state of every
        # position they evaluate.
        mtp = [span for span in plan.spans if isinstance(span[0].drafter, MtpDrafter)]
        hidden_rows = [i for _, first, n, _ in mtp for i in range(first, first + n)]
        try:
            if hidden_rows:
                logits, hidden = self.model.eval_batch(*plan.arrays(), hidden_rows=np.asarray(hidden_rows))
            else:
                logits = self.model.eval_batch(*plan.arrays())
        except BaseException as e:  # the memory of these sequences is now undefined
            for s in plan.sequences:
                kv.clear(s.slot)
            if self.raise_errors or not isinstance(e, Exception):  # (Ctrl-C, too, goes to the caller)
                raise
            log.exception("batch evaluation failed")
            for s in plan.sequences:
                self._fail(s, f"evaluation failed: {e}")
            return
        self.steps_total += 1
        if self.rest_between_steps and self.n_threads > 1:
            # Sampling and handing out text come next (a millisecond or more, on this thread, holding the
            # GIL): the team's workers would spin through it on cores the event loop needs.
            rest_workers()
        plan.record(kv)
        n_generated = 0
        row = 0
        for s, n_rows in zip(plan.owners, plan.n_rows, strict=True):
            row += n_rows
            drafted, accepted = s.drafted, s.accepted
            try:
                step, n_tokens = verify(s, logits[row - n_rows : row], kv)
            except Exception as e:  # e.g. NaN logits: this sequence only
                if self.raise_errors:
                    kv.clear(s.slot)  # its drafts may be in the memory, unverified
                    raise
                log.exception("sampling failed for request %s", s.handle.id)
                self._fail(s, f"sampling failed: {e}")
                continue
            self.draft_tokens_total += s.drafted - drafted
            self.draft_accepted_total += s.accepted - accepted
            n_generated += n_tokens
            if step.finish_reason is not None:
                self._finish(s, step.finish_reason)
        if mtp:
            self._observe(mtp, hidden)
        self.generated_tokens_total += n_generated
        now = time.perf_counter()
        self._recent.append((now, n_generated))
        while self._recent and now - self._recent[0][0] > _RATE_WINDOW_S:
            self._recent.popleft()

    def _observe(self, spans: list[tuple[Running, int, int, int]], hidden: np.ndarray) -> None:
        """Feed each sequence's multi-token-prediction drafter the positions its memory kept this step
        (a rejected draft's are gone) and the token it evaluates next."""
        kv = self.model.kv
        row = 0
        for s, _, n, p0 in spans:
            rows, row = hidden[row : row + n], row + n
            if self._active.get(s.slot) is not s:  # it ended this step
                continue
            tokens = kv.tokens[s.slot]
            kept = min(n, len(tokens) - p0)
            nxt = s.next_token if not s.prefilling else s.prompt[s.n_prompt_done]
            if kept > 0 and nxt is not None:
                s.drafter.observe(tokens, nxt, p0, rows[:kept])  # type: ignore[union-attr]

    # ---- the end of a sequence ----------------------------------------------------------------------

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
        # The slot's memory keeps what it holds (even a half-done prompt is a valid prefix) for reuse.
        self.n_active = len(self._active)

    def abandon(self, s: Running) -> None:
        """Free s's slot without an event (its caller has stopped listening or has its error); the memory
        keeps what it holds."""
        self._release(s)

    def fail_active(self, message: str, shutdown: bool = True) -> None:
        """End every running sequence with Failed (a shutdown, an abandoned caller)."""
        for s in list(self._active.values()):
            self._fail(s, message, shutdown=shutdown)
