"""Single-sequence generation: one conversation held in a Model's KV cache across calls.

    session = Session(model, tokenizer, n_ctx_train)
    for tok, piece in session.generate(ids, params, max_tokens=16):
        ...
    session.last                       # the Completion: text, tokens, finish_reason, stats

Each call keeps the cached prefix it shares with the previous conversation (a chat that goes on evaluates only
its new tokens). The steps after the prompt are the scheduler's: see steps.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from llamacy.errors import UsageError
from llamacy.generation.shift import shifted, truncate_prompt
from llamacy.generation.speculate import ModelDrafter, NgramDrafter, Speculation
from llamacy.generation.steps import SequenceState, check_prompt, verified_steps
from llamacy.sampling import Sampler, SamplingParams


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
        is "" while a character or stop string is incomplete. self.last grows as it goes. `constraint` (a
        llamacy.structured.Constraint) confines the output to its grammar. `speculate` drafts tokens and
        verifies them in one batched step; the output is distributed as without it (greedy: identical).
        draft_model: the Model (one sequence) that drafts when speculate.mode is "draft". on_prompt(ids) is
        called once the prompt is evaluated, while the memory holds exactly it (a prompt cache saves it).
        shift_keep: context shift (shift.py) with the first shift_keep tokens kept: a prompt too long is
        fitted, and a full context drops the older half of what follows them and goes on; None: off."""
        t0 = time.perf_counter()
        model = self.model
        kv = model.kv
        ids = list(ids)
        if shift_keep is not None:
            ids = truncate_prompt(ids, self.n_ctx, shift_keep)
        check_prompt(ids, self.n_ctx, model.cfg.n_vocab, self.n_ctx_train)
        done = Completion(stats=Stats(load_s=load_s, prompt_tokens=len(ids)))
        self.last = done
        st = done.stats
        if self.profiling:
            model.forward.profile_reset()
        # The tokenizer's end-of-generation ids are read now: a caller may change them between calls.
        sampler = Sampler(params, model.cfg.n_vocab)
        state = SequenceState(
            ids,
            sampler,
            self.tokenizer,
            stop,
            self.tokenizer.eot_ids,
            max_tokens,
            timed=self.profiling,
            constraint=constraint,
        )
        drafter = self._drafter(speculate, constraint, params, sampler.seed, draft_model)
        keep = kv.reuse_prefix(0, ids)
        st.prompt_evaluated = len(ids) - keep
        rows = model.eval(ids[keep:], logits="last")[None, :]
        kv.checkpoint(0)  # a recurrent model's next turn resumes here (memory.py)
        t_gen = time.perf_counter()
        st.prompt_s = t_gen - t0
        if on_prompt is not None:
            on_prompt(ids)
        draft: list[int] = []
        # With context shift the context never counts as full: _shift makes room before it would be.
        n_ctx = self.n_ctx if shift_keep is None else 1 << 62
        while True:
            cached = kv.length(0) - len(draft)  # the cache as plain decoding would hold it at rows[0]
            n_steps = 0
            probs = drafter.probs if drafter is not None else ()
            for step in verified_steps(state, rows, draft, cached, n_ctx, probs):
                n_steps += 1
                if not done.tokens:
                    st.first_token_s = time.perf_counter() - t0
                if step.token is not None:
                    st.gen_tokens += 1 + len(step.forced)
                    done.tokens.append(step.token)
                    done.tokens.extend(step.forced)
                    done.text += step.piece
                    yield step.token, step.piece
                    for tok in step.forced:  # their text came with the first token's piece
                        yield tok, ""
            accepted = n_steps - 1
            st.draft_accepted += accepted
            # Drafts after the one rejected (or after the end) hold cache positions plain decoding never
            # filled: forget them.
            kv.truncate(0, cached + accepted)
            if step.finish_reason is not None:
                done.finish_reason = step.finish_reason
                break
            if drafter is not None:
                drafter.feedback(len(draft), accepted)
            pending = [step.token, *step.forced]
            if shift_keep is not None and kv.length(0) + len(pending) > self.n_ctx:
                self._shift(shift_keep, len(pending))
                st.context_shifts += 1
            draft = self._draft(drafter, state, kv.length(0) + len(pending), max_tokens)
            st.draft_tokens += len(draft)
            # With drafts, the logits of the last pending token and of every draft; else of the last token.
            if draft:
                rows = model.eval(pending + draft, logits="all")[len(pending) - 1 :]
            else:
                rows = model.eval(pending, logits="last")[None, :]
            st.gen_s = time.perf_counter() - t_gen
        tail = state.flush()
        if tail:
            done.text += tail
            yield -1, tail
        st.gen_s = time.perf_counter() - t_gen
        if self.profiling:
            st.profile = model.forward.profile()
            st.profile["sampling"] = state.t_sample
            st.profile["detokenizing"] = state.t_detok
            st.profile["python and other"] = max(0.0, time.perf_counter() - t0 - sum(st.profile.values()))

    def _shift(self, keep: int, pending: int) -> None:
        """Make room for `pending` tokens: keep the first `keep` tokens and the newer half of the rest, and
        evaluate the kept ones after `keep` again at their new positions (exact for every layer kind)."""
        kv = self.model.kv
        new = shifted(kv.tokens[0], keep)
        while len(new) + pending > self.n_ctx:
            new = shifted(new, keep)
        start = kv.reuse_prefix(0, new)  # the first keep (0 if a window's rows are gone)
        self.model.eval(new[start:], logits="last")

    @staticmethod
    def _drafter(
        spec: Speculation | None, constraint: Any, params: SamplingParams, seed: int, draft_model: Any
    ) -> NgramDrafter | ModelDrafter | None:
        if spec is None or constraint is not None:  # a grammar forces what it can already
            return None
        if spec.mode == "draft":
            if draft_model is None:
                raise UsageError("speculate mode 'draft' needs a draft model")
            # Its own random stream, not the target's: the draft's draws must not change the target's.
            return ModelDrafter(draft_model, spec, params, (seed * 0x9E3779B97F4A7C15 + 1) % 2**64)
        return NgramDrafter(spec)

    def _draft(
        self,
        drafter: NgramDrafter | ModelDrafter | None,
        state: SequenceState,
        length: int,
        max_tokens: int | None,
    ) -> list[int]:
        """Drafts for the positions after the pending token(s), which the cache will hold at `length`: no
        more than fit the context (the last position's logits must still be sampled) or max_tokens."""
        if drafter is None:
            return []
        limit = self.n_ctx - length
        if max_tokens is not None:
            limit = min(limit, max_tokens - len(state.tokens) - 1)
        if self.model.kv.max_rollback is not None:  # rejected drafts must be droppable (memory.py)
            limit = min(limit, self.model.kv.max_rollback - 1)
        return drafter.propose(state.history, limit)
