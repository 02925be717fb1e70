"""Applying a step's results: every sequence whose logits came back takes the generation steps shared with
the single-sequence session (sampling, logprobs, end of generation, stop strings; verification of its
drafts, if it speculates), and its events go out:
a Piece whenever text becomes safe to show, a Done at the end."""

from __future__ import annotations

import time

import numpy as np

from llamacy.generation.steps import Step, verified_steps
from llamacy.model.memory import Memory
from llamacy.scheduler.plan import Running
from llamacy.scheduler.requests import Done, Handle, Piece, Timings, Usage


def verify(s: Running, rows: np.ndarray, kv: Memory) -> tuple[Step, int]:
    """s evaluated its next token and s.draft in this step; rows are its logits (the last pending token's,
    then each draft's). Take the steps plain decoding would take while the drafts hold, send their text, cut
    the rejected drafts from the cache (counting them in s.drafted, s.accepted). Returns the last step and the
    tokens generated."""
    cached = kv.length(s.slot) - len(s.draft)
    n_steps = n_tokens = 0
    probs = s.drafter.probs if s.drafter is not None else ()  # a model draft's distributions
    # A sequence that shifts its context never finds it full (the scheduler makes room before it would be).
    n_ctx = kv.n_ctx if s.handle.request.shift_keep is None else 1 << 62
    for step in verified_steps(s.state, rows, s.draft, cached, n_ctx, probs):
        deliver(s, step)
        n_steps += 1
        n_tokens += 0 if step.token is None else 1 + len(step.forced)
    kv.truncate(s.slot, cached + n_steps - 1)
    s.drafted += len(s.draft)
    s.accepted += n_steps - 1
    if s.drafter is not None and step.finish_reason is None:
        s.drafter.feedback(len(s.draft), n_steps - 1)
    s.draft = []
    return step, n_tokens


def deliver(s: Running, step: Step) -> Step:
    """Record a step of s and send the text that is now safe to show."""
    if s.t_first is None:
        s.t_first = time.perf_counter()
    if step.token is not None:
        s.unsent.append(step.token)
        s.unsent.extend(step.forced)
        if step.logprob is not None:
            s.unsent_lp.append(step.logprob)
        if step.piece:
            send(s, step.piece)
        if step.finish_reason is None:
            s.next_token = step.token
            s.next_forced = step.forced
    return step


def send(s: Running, text: str, final: bool = False) -> None:
    """A Piece with text and the tokens generated since the previous one."""
    lp = s.unsent_lp if s.handle.request.logprobs is not None else None
    s.handle._emit(Piece(text, s.unsent, lp, final))
    s.unsent, s.unsent_lp = [], []


def final_event(s: Running, reason: str) -> Done:
    """The Done that ends s. Unless it was cancelled, the text held back to the end (a possible stop string,
    an incomplete character) and unsent tokens go out first in a last Piece."""
    if reason != "cancelled":
        tail = s.state.flush()
        if tail or s.unsent:
            send(s, tail, final=True)
    now = time.perf_counter()
    h = s.handle
    t_first = s.t_first or now
    prompt_s = t_first - s.t_start
    predict_s = now - t_first
    n_eval = s.n_prompt - s.cached
    n_gen = len(s.state.tokens)
    timings = Timings(
        queue_ms=(s.t_start - h.t_created) * 1000,
        prompt_ms=prompt_s * 1000,
        predict_ms=predict_s * 1000,
        total_ms=(now - h.t_created) * 1000,
        prompt_tokens_per_second=n_eval / prompt_s if prompt_s > 0 else 0.0,
        tokens_per_second=n_gen / predict_s if predict_s > 0 else 0.0,
    )
    usage = Usage(s.n_prompt, n_gen, s.cached)
    return Done(reason, "".join(s.state.text), s.state.tokens, usage, timings, h.seed, s.state.stops.matched)


def cancelled_in_queue(handle: Handle) -> Done:
    """The Done of a request cancelled before it got a slot."""
    ms = (time.perf_counter() - handle.t_created) * 1000
    return Done(
        "cancelled", "", [], Usage(handle.prompt_tokens, 0, 0), Timings(ms, 0, 0, ms, 0, 0), handle.seed
    )
