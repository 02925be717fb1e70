"""Planning a step: which sequences go into the next batch, and which chunk of each prompt.

A step is ONE call to Model.eval_batch holding the next token of every decoding sequence (and the drafts of
a speculating sequence that is alone in the step) plus chunks of the prompts of the oldest prefilling
sequences (chunked prefill: a long prompt costs the others at most
`prefill_chunk` extra tokens per step). When nothing is decoding there is nobody to stall, and prompts go in
`solo_chunk` tokens at a time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from llamacy.generation.shift import shifted
from llamacy.generation.speculate import ModelDrafter, MtpDrafter, NgramDrafter
from llamacy.generation.steps import SequenceState, TokenLogprob
from llamacy.model.memory import Memory
from llamacy.scheduler.requests import Handle


class Running:
    """A request that holds a slot (sequence `slot` of the KV cache): its prompt progress and generation
    state. Owned by the scheduler thread."""

    def __init__(
        self,
        handle: Handle,
        slot: int,
        cached: int,
        state: SequenceState,
        drafter: NgramDrafter | ModelDrafter | MtpDrafter | None = None,
    ) -> None:
        self.handle = handle
        self.slot = slot
        self.prompt = handle.request.prompt  # after a context shift: the kept tokens, evaluated again
        self.n_prompt = len(self.prompt)  # the request's prompt tokens (usage)
        self.cached = cached  # prompt tokens reused from the slot's cache
        self.n_prompt_done = cached  # prompt tokens whose K/V are in the cache
        self.state = state
        self.next_token: int | None = None  # sampled, evaluated at the next step
        self.next_forced: tuple[int, ...] = ()  # tokens a grammar forced after it, evaluated with it
        self.drafter = drafter  # speculative decoding: proposes tokens after next_token
        self.draft: list[int] = []  # drafted tokens evaluated in the current step after next_token
        self.unsent: list[int] = []  # tokens not yet reported in a Piece
        self.unsent_lp: list[TokenLogprob] = []
        self.t_start = time.perf_counter()
        self.t_first: float | None = None  # when the prompt was done
        self.shifts = 0  # context shifts (shift_context)
        self.drafted = 0  # speculative decoding: tokens drafted, and of those, accepted
        self.accepted = 0

    @property
    def prefilling(self) -> bool:
        return self.next_token is None


@dataclass
class StepPlan:
    """One batch: (token, position, sequence) triples, and the rows whose logits come back."""

    tokens: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)  # batch indices whose logits are wanted
    owners: list[Running] = field(default_factory=list)  # the sequences whose logits come back, in row order
    n_rows: list[int] = field(default_factory=list)  # rows per owner: 1, or 1 + its drafts
    decoding: list[Running] = field(default_factory=list)  # each evaluates its next_token
    chunks: list[tuple[Running, list[int]]] = field(default_factory=list)  # prompt tokens evaluated
    # Per sequence with tokens in the batch: (it, its first batch index, how many, its first position).
    spans: list[tuple[Running, int, int, int]] = field(default_factory=list)

    @property
    def sequences(self) -> list[Running]:
        """Every sequence with tokens in the batch."""
        return self.decoding + [s for s, _ in self.chunks]

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """tokens, positions, sequences and rows as Model.eval_batch takes them."""
        return (
            np.asarray(self.tokens, np.int32),
            np.asarray(self.pos, np.int32),
            np.asarray(self.seqs, np.int32),
            np.asarray(self.rows, np.int32),
        )

    def record(self, kv: Memory) -> None:
        """After the batch was evaluated: the cache holds its tokens, the prompts have advanced."""
        for s in self.decoding:
            kv.append(s.slot, [s.next_token, *s.next_forced, *s.draft])  # type: ignore[list-item]
        for s, chunk in self.chunks:
            kv.append(s.slot, chunk)
            s.n_prompt_done += len(chunk)
            if s.n_prompt_done == len(s.prompt):
                kv.checkpoint(s.slot)  # a recurrent model's next turn resumes here (memory.py)


def plan_step(active: Iterable[Running], kv: Memory, prefill_chunk: int, solo_chunk: int) -> StepPlan:
    """A token for every decoding sequence, then prompt chunks, oldest request first."""
    plan = StepPlan()
    active = list(active)
    plan.decoding = [s for s in active if not s.prefilling]
    prefilling = sorted((s for s in active if s.prefilling), key=lambda s: s.t_start)
    # Drafts only for a sequence alone in the step: each drafted row costs a fraction of a decoding step,
    # which every other sequence of the batch would wait for.
    alone = len(active) == 1
    for s in plan.decoding:
        pending = [s.next_token, *s.next_forced]  # forced tokens: one batch with the sampled one
        start = kv.length(s.slot)
        s.draft = draft_for(s, start + len(pending), kv.n_ctx, kv.max_rollback) if alone else []
        new = pending + s.draft
        plan.spans.append((s, len(plan.tokens), len(new), start))
        plan.tokens.extend(new)  # type: ignore[arg-type]
        plan.pos.extend(range(start, start + len(new)))
        plan.seqs.extend([s.slot] * len(new))
        first = len(plan.tokens) - len(s.draft) - 1  # the last pending token, then each draft
        plan.rows.extend(range(first, len(plan.tokens)))
        plan.owners.append(s)
        plan.n_rows.append(1 + len(s.draft))
    budget = prefill_chunk if plan.decoding else solo_chunk
    for s in prefilling:
        if budget <= 0:
            break
        chunk = s.prompt[s.n_prompt_done : s.n_prompt_done + budget]
        budget -= len(chunk)
        plan.chunks.append((s, chunk))
        plan.spans.append((s, len(plan.tokens), len(chunk), s.n_prompt_done))
        plan.tokens.extend(chunk)
        plan.pos.extend(range(s.n_prompt_done, s.n_prompt_done + len(chunk)))
        plan.seqs.extend([s.slot] * len(chunk))
        if s.n_prompt_done + len(chunk) == len(s.prompt):  # the prompt is done: its last logits sample
            plan.rows.append(len(plan.tokens) - 1)
            plan.owners.append(s)
            plan.n_rows.append(1)
    return plan


def shift_context(s: Running, kv: Memory) -> None:
    """When s's pending tokens no longer fit its context: keep its first shift_keep tokens and the newer
    half of the rest (shift.py), and make s prefill the kept tokens after those the memory can go back to,
    then its pending tokens, whose logits sample the next token as a prompt's last ones do."""
    pending = [s.next_token, *s.next_forced]
    if kv.length(s.slot) + len(pending) <= kv.n_ctx:
        return
    keep = s.handle.request.shift_keep
    new = shifted(kv.tokens[s.slot], keep)
    while len(new) + len(pending) > kv.n_ctx:
        new = shifted(new, keep)
    s.n_prompt_done = kv.reuse_prefix(s.slot, new)
    s.prompt = new + pending  # type: ignore[operator]
    s.next_token, s.next_forced = None, ()
    s.shifts += 1


def draft_for(s: Running, length: int, n_ctx: int, max_rollback: int | None = None) -> list[int]:
    """Tokens s drafts after its pending ones, which the cache will hold at `length`: no more than fit
    the context or its max_tokens (the position after the last draft must still be sampled), nor more
    than the memory can drop again when they are rejected (memory.py's max_rollback)."""
    if s.drafter is None:
        return []
    limit = n_ctx - length
    if max_rollback is not None:
        limit = min(limit, max_rollback - 1)
    if s.state.max_tokens is not None:
        limit = min(limit, s.state.max_tokens - len(s.state.tokens) - 1)
    return s.drafter.propose(s.state.history, limit)
