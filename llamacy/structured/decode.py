"""The constrained part of one generation step, shared by the single-sequence session and the scheduler.

    tokens = next_tokens(constraint, lambda mask: sampler.sample(logits, history, mask), stop_ids, budget)

Tokens the grammar forces come without sampling (their logits are not needed) and are returned together, so the
caller evaluates them as one batch; otherwise one token is sampled and any forced continuation is appended to
it. An empty list means the model chose an end-of-generation token.

The draw is llama.cpp's (common_sampler_sample without grammar_first): sample from the unmasked logits, check
that one token against the grammar, and only when it does not fit compute the whole mask and draw again under
it. A full mask costs 0.1-0.5 ms (and applying it to the logits as much again), a one-token check ~15 us,
and a model writing JSON mostly picks a token that fits. Greedy decoding gives exactly what masking first
gives. A sampled token has probability p(t) + (1 - Z) q(t), where p is the unmasked chain's distribution, Z
the share of it that fits and q the masked chain's; without truncation (top-k/top-p/min-p off) that is q
exactly, with it the truncation is applied before the grammar, as in llama.cpp.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from llamacy.structured.constraint import Constraint


def next_tokens(
    constraint: Constraint,
    sample: Callable[[np.ndarray | None], int],
    stop_ids: Collection[int],
    budget: int,
) -> list[int]:
    """The tokens to append now (at most `budget`, at least 1 when budget ≥ 1), already accepted by the
    constraint; [] when the sampled token ends generation. Check constraint.done afterwards: a complete
    grammar ends the sequence with finish_reason "stop"."""
    if budget < 1:
        return []
    forced = constraint.forced()[:budget]
    if forced:
        constraint.accept_all(forced)
        return forced
    tok = sample(None)
    if not constraint.fits(tok):
        tok = sample(constraint.allowed())
    if tok in stop_ids:
        return []  # the grammar allows the end tokens only where it is complete
    constraint.accept(tok)
    out = [tok]
    if budget > 1 and not constraint.done:
        more = constraint.forced()[: budget - 1]
        if more:
            constraint.accept_all(more)
            out += more
    return out
