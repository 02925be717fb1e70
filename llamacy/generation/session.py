"""Single-sequence generation: one conversation held in a Model's memory across calls.

    session = Session(model, tokenizer, n_ctx_train)
    for tok, piece in session.generate(ids, params, max_tokens=16):
        ...
    session.last                       # the Completion: text, tokens, finish_reason, stats

A Session is the scheduler's Batcher (llamacy/scheduler/batcher.py) with one slot, stepped in the caller's
thread: run, chat and the Python API generate exactly as serve and batch do (prefix reuse, drafting and
verification, stop handling, structured output, context shift), without a server thread. Each call keeps
the cached prefix it shares with the previous conversation (a chat that goes on evaluates only its new
tokens).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from llamacy.errors import LlamacyError
from llamacy.generation.shift import truncate_prompt
from llamacy.generation.speculate import Speculation
from llamacy.sampling import SamplingParams
from llamacy.scheduler.batcher import Batcher
from llamacy.scheduler.requests import Done, Event, Failed, GenerationRequest, Handle, Piece


@dataclass
class Stats:
    load_s: float = 0.0
    prompt_tokens: int = 0  # tokens in the prompt
    prompt_evaluated: int = 0  # of those, evaluated now (the rest came from the KV cache)
    prompt_s: float = 0.0
    gen_tokens: int = 0
    gen_s: float = 0.0
    first_token_s: float = 0.0  # from the call to the first generated token
    draft_tokens: int = 0  # speculative decoding: tokens drafted, and of those, accepted
    draft_accepted: int = 0
    context_shifts: int = 0  # times a full context dropped its older half (shift_keep)
    profile: dict[str, float] = field(default_factory=dict)  # seconds per stage, with profiling on

    @property
    def prompt_tps(self) -> float:
        return self.prompt_evaluated / self.prompt_s if self.prompt_s > 0 else 0.0

    @property
    def gen_tps(self) -> float:
        return self.gen_tokens / self.gen_s if self.gen_s > 0 else 0.0


@dataclass
class Completion:
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" (EOS or a stop string), "length", or None while running
    stats: Stats = field(default_factory=Stats)


class Session:
    """Generation in sequence 0 of a Model (built with one sequence)."""

    def __init__(self, model: Any, tokenizer: Any, n_ctx_train: int, profiling: bool = False) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.n_ctx = model.n_ctx
        self.n_ctx_train = n_ctx_train
        self.profiling = profiling
        if profiling:
            model.forward.set_profiling(True)
        # Nothing else waits on this slot, so a prompt goes in as one step (the Model cuts it into its
        # micro-batches) and errors reach the caller as they are.
        self.batcher = Batcher(
            model, tokenizer, n_ctx_train, model.n_ctx, model.n_ctx, timed=profiling, raise_errors=True
        )
        self.last: Completion | None = None

    def generate(
        self,
        ids: Sequence[int],
        params: SamplingParams,
        max_tokens: int | None = None,
        stop: Sequence[str] = (),
        load_s: float = 0.0,
        constraint: Any = None,
        speculate: Speculation | None = None,
        draft_model: Any = None,
        on_prompt: Callable[[list[int]], None] | None = None,
        shift_keep: int | None = None,
    ) -> Iterator[tuple[int, str]]:
        """Yield (token id, text piece) as generated, then (-1, text held back to the end) if any. The piece
        is "" while a character or stop string is incomplete (it comes with the token that completes it).
        self.last grows as it goes. `constraint` (a llamacy.structured.Constraint) confines the output to
        its grammar. `speculate` drafts tokens and verifies them in one batched step; the output is
        distributed as without it (greedy: identical). draft_model: the Model (one sequence) that drafts
        when speculate.mode is "draft". on_prompt(ids) is called once the prompt is evaluated, while the
        memory holds exactly it (a prompt cache saves it). shift_keep: context shift (shift.py) with the
        first shift_keep tokens kept: a prompt too long is fitted, and a full context drops the older half
        of what follows them and goes on; None: off."""
        t0 = time.perf_counter()
        ids = list(ids)
        if shift_keep is not None:
            ids = truncate_prompt(ids, self.n_ctx, shift_keep)
        batcher = self.batcher
        batcher.draft_model = draft_model
        # The tokenizer's end-of-generation ids are read now: a caller may change them between calls.
        request = GenerationRequest(
            ids,
            params,
            max_tokens,
            stop,
            frozenset(self.tokenizer.eot_ids),
            constraint=constraint,
            speculate=speculate,
            shift_keep=shift_keep,
        )
        sampler = batcher.check(request)
        events: list[Event] = []
        handle = Handle(request, sampler.seed, events.append)
        done = Completion(stats=Stats(load_s=load_s, prompt_tokens=len(ids)))
        self.last = done
        st = done.stats
        if self.profiling:
            self.model.forward.profile_reset()
        seq = batcher.admit(handle, sampler)
        st.prompt_evaluated = len(ids) - seq.cached
        prompt_done = False
        try:
            while not handle.finished:
                batcher.step()
                if not prompt_done and seq.t_first is not None:
                    prompt_done = True
                    st.prompt_s = st.first_token_s = seq.t_first - t0
                    if on_prompt is not None:
                        on_prompt(ids)
                yield from self._yields(events, done)
                events.clear()
                st.draft_tokens, st.draft_accepted = seq.drafted, seq.accepted
                st.context_shifts = seq.shifts
                st.gen_s = time.perf_counter() - (seq.t_first or t0)
        finally:
            if not handle.finished:  # the caller stopped early, or an error: the slot's memory stays valid
                batcher.abandon(seq)
        if self.profiling:
            st.profile = self.model.forward.profile()
            st.profile["sampling"] = seq.state.t_sample
            st.profile["detokenizing"] = seq.state.t_detok
            st.profile["python and other"] = max(0.0, time.perf_counter() - t0 - sum(st.profile.values()))

    @staticmethod
    def _yields(events: list[Event], done: Completion) -> Iterator[tuple[int, str]]:
        """A step's events as (token, piece) pairs: a Piece's text comes with its last token (the one that
        completed it), the text held back to the end as (-1, text)."""
        for ev in events:
            if isinstance(ev, Piece):
                done.tokens.extend(ev.tokens)
                done.text += ev.text
                done.stats.gen_tokens += len(ev.tokens)
                for tok in ev.tokens[:-1]:
                    yield tok, ""
                if ev.final:
                    if ev.tokens:
                        yield ev.tokens[-1], ""
                    if ev.text:
                        yield -1, ev.text
                elif ev.tokens:
                    yield ev.tokens[-1], ev.text
            elif isinstance(ev, Done):
                done.finish_reason = ev.finish_reason
            elif isinstance(ev, Failed):  # raise_errors: only a shutdown would send one, and none comes
                raise LlamacyError(ev.message)
