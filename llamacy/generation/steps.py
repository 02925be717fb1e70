"""The steps every generator takes, written once: the single-sequence session and the scheduler both use them.

- sampling_params: request options (dict) -> validated SamplingParams.
- check_prompt: a prompt that can never run fails before any work, with a one-line error.
- SequenceState.step: sample a token from the logits of the last position, end of generation (stop ids),
  detokenization, stop strings, max_tokens and a full context; SequenceState.flush: at the end, the text
  held back (an incomplete character, a possible stop string) is released.

Prefix reuse lives with the KV cache (KVCache.reuse_prefix), which both generators call.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from llamacy.errors import ContextOverflowError, LlamacyError, UsageError
from llamacy.generation.speculate import verify_token
from llamacy.sampling import Sampler, SamplingParams
from llamacy.stopping import StopMatcher
from llamacy.structured.decode import next_tokens

# Short names the command line and llama-cpp-python style callers use for SamplingParams fields.
_ALIASES = {"temp": "temperature", "repeat_last": "repeat_last_n"}


def sampling_params(options: dict[str, Any]) -> SamplingParams:
    """SamplingParams from keyword options (None: the default); UsageError for an unknown or bad one."""
    kwargs = {_ALIASES.get(k, k): v for k, v in options.items() if v is not None}
    try:
        params = SamplingParams(**kwargs)
    except TypeError as e:
        raise UsageError(f"unknown sampling option: {e}") from None
    params.validate()
    return params


def check_prompt(ids: Sequence[int], n_ctx: int, n_vocab: int, n_ctx_train: int) -> None:
    """Refuse a prompt that can never run: empty, ids outside the vocabulary, or no room left in a
    context of n_ctx tokens for even one generated token."""
    if not ids:
        raise UsageError("the prompt is empty (no tokens); give some text")
    if len(ids) >= n_ctx:
        raise ContextOverflowError(
            f"the prompt has {len(ids)} tokens but the context holds {n_ctx} "
            f"(raise --ctx-size, up to {n_ctx_train}, or shorten the prompt)"
        )
    if min(ids) < 0 or max(ids) >= n_vocab:
        raise UsageError(f"the prompt holds token ids outside the vocabulary [0, {n_vocab})")


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float  # log-softmax of the model's raw logits (before penalties and temperature)
    top: list[tuple[int, float]]  # the k most likely (token, logprob), best first


def token_logprob(row: np.ndarray, token: int, k: int) -> TokenLogprob:
    """The logprob of `token` under the logits `row`, and the k most likely alternatives."""
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


class Step(NamedTuple):  # a tuple: one is made per token
    token: int | None  # the generated token; None when the sequence ended without one
    piece: str  # text safe to show now: "" while a character or a possible stop string is incomplete
    logprob: TokenLogprob | None  # when logprobs were asked for
    finish_reason: str | None  # "stop" (a stop id or string), "length" (max_tokens or context), None: go on
    # Tokens a grammar forced right after `token` (the piece covers them too): evaluated with it, as one batch.
    forced: tuple[int, ...] = ()


class SequenceState:
    """One sequence's generation state between tokens: sampler, history for the penalties, the streaming
    detokenizer, the stop strings, and what was generated so far."""

    def __init__(
        self,
        prompt: Sequence[int],
        sampler: Sampler,
        tokenizer: Any,
        stop: Sequence[str] = (),
        stop_ids: Collection[int] = (),
        max_tokens: int | None = None,
        logprobs: int | None = None,
        timed: bool = False,
        constraint: Any = None,
    ) -> None:
        """timed: add up the seconds spent sampling and detokenizing (t_sample, t_detok), for profiles."""
        self.sampler = sampler
        self.constraint = constraint  # a llamacy.structured.Constraint: grammar mask, forced tokens
        self.history = list(prompt)  # what the penalties look at: prompt + generated
        self.stop_ids = stop_ids
        self.max_tokens = max_tokens  # None: no limit but the context
        self.logprobs = logprobs  # None: off; k: the token's logprob and k alternatives
        self.decoder = tokenizer.stream_decoder()
        self.stops = StopMatcher(list(stop))
        self.tokens: list[int] = []
        self.text: list[str] = []  # the pieces shown so far
        self.timed = timed
        self.t_sample = 0.0
        self.t_detok = 0.0

    @property
    def at_limit(self) -> bool:
        return self.max_tokens is not None and len(self.tokens) >= self.max_tokens

    def step(
        self,
        logits: np.ndarray,
        context_full: bool,
        room: int = 1,
        draft: int | None = None,
        draft_q: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> Step:
        """The next token from the logits of the last evaluated position. context_full: the cache has no
        room to evaluate another token, so the one sampled now is the last. room: how many tokens the cache
        can still take (a constrained step may add forced tokens up to it). draft: a speculative guess for
        this position, verified by a rule that keeps the sampling distribution exact (speculate.py); draft_q:
        the distribution it was drawn from (None: a deterministic guess)."""
        if self.at_limit:  # max_tokens = 0
            return Step(None, "", None, "length")
        if self.constraint is not None:
            return self._constrained_step(logits, context_full, room)
        t0 = time.perf_counter() if self.timed else 0.0
        try:
            if draft is None:
                tok = self.sampler.sample(logits, self.history)
            else:
                tok = verify_token(self.sampler, logits, self.history, draft, draft_q)
        except ValueError:
            # The sampler refuses NaN and infinite logits; checked here only then, off the hot path.
            if np.isfinite(logits.max()):  # max() is NaN if any logit is NaN
                raise
            raise LlamacyError(
                f"the model produced non-finite logits at position {len(self.history)}: "
                "its weights are likely corrupt"
            ) from None
        if self.timed:
            t1 = time.perf_counter()
            self.t_sample += t1 - t0
        if tok in self.stop_ids:
            return Step(None, "", None, "stop")
        self.tokens.append(tok)
        self.history.append(tok)
        piece = self.stops.feed(self.decoder.feed(tok))
        if self.timed:
            self.t_detok += time.perf_counter() - t1
        lp = token_logprob(logits, tok, self.logprobs) if self.logprobs is not None else None
        if piece:
            self.text.append(piece)
        reason = None
        if self.stops.stopped:
            reason = "stop"
        elif self.at_limit or context_full:
            reason = "length"
        return Step(tok, piece, lp, reason)

    def _constrained_step(self, logits: np.ndarray, context_full: bool, room: int) -> Step:
        """step() under a grammar: the mask in the draw, forced tokens without one, and the end of the
        sequence when the grammar is complete."""
        # With logprobs, one token per step: a forced token evaluated in a batch would have no logits of its own.
        budget = 1 if context_full or self.logprobs is not None else max(1, room)
        if self.max_tokens is not None:
            budget = min(budget, self.max_tokens - len(self.tokens))
        t0 = time.perf_counter()
        history = self.history
        toks = next_tokens(
            self.constraint, lambda mask: self.sampler.sample(logits, history, mask), self.stop_ids, budget
        )
        t1 = time.perf_counter()
        if self.timed:
            self.t_sample += t1 - t0
        if not toks:
            return Step(None, "", None, "stop")
        pieces = []
        for tok in toks:
            self.tokens.append(tok)
            self.history.append(tok)
            pieces.append(self.stops.feed(self.decoder.feed(tok)))
            if self.stops.stopped:
                break
        piece = "".join(pieces)
        if self.timed:
            self.t_detok += time.perf_counter() - t1
        # The logits are the model's distribution for the first token, sampled or forced.
        lp = token_logprob(logits, toks[0], self.logprobs) if self.logprobs is not None else None
        if piece:
            self.text.append(piece)
        reason = None
        if self.stops.stopped or self.constraint.done:
            reason = "stop"
        elif self.at_limit or context_full:
            reason = "length"
        return Step(toks[0], piece, lp, reason, tuple(toks[1 : len(pieces)]))

    def flush(self) -> str:
        """At the end of generation: release the text held back as an incomplete character or a possible
        stop string (nothing once a stop string has ended the sequence)."""
        if self.stops.stopped:
            return ""
        tail = self.stops.feed(self.decoder.flush()) + self.stops.flush()
        if tail:
            self.text.append(tail)
        return tail


def verified_steps(
    state: SequenceState,
    rows: np.ndarray,
    draft: Sequence[int],
    cached: int,
    n_ctx: int,
    probs: Sequence[Any] = (),
) -> Iterator[Step]:
    """The steps of a sequence over the logits of one batched evaluation of its pending token(s) and
    `draft`: rows[i] is the position where draft[i] was guessed, the last row the one after all drafts.
    Each position is stepped as plain decoding would step it (the history holds the drafts before it; the
    cache, seen as `cached` + i tokens of n_ctx), and the steps end at the first token that differs from its
    draft or that ends the sequence. The caller keeps cached + (steps - 1) positions of the cache. probs: the
    draft distribution of each draft token (a drafter's .probs), empty or None entries for point masses."""
    for i, row in enumerate(rows):
        room = n_ctx - cached - i
        guess = draft[i] if i < len(draft) else None
        q = probs[i] if i < len(probs) else None
        step = state.step(row, context_full=room <= 0, room=room, draft=guess, draft_q=q)
        yield step
        if step.finish_reason is not None or step.token != guess:
            return
