"""The constrained part of one generation step, shared by the single-sequence session and the scheduler.

    tokens = next_tokens(constraint, lambda mask: sampler.sample(logits, history, mask), stop_ids, budget)

Tokens the grammar forces come without sampling (their logits are not needed) and are returned together, so the
caller evaluates them as one batch; otherwise one token is sampled under the grammar's mask and any forced
continuation is appended to it. An empty list means the model chose an end-of-generation token.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np

from llamacy.structured.constraint import Constraint


def next_tokens(
    constraint: Constraint,
    sample: Callable[[np.ndarray], int],
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
    tok = sample(constraint.allowed())
    if tok in stop_ids:
        return []  # the mask allows the end tokens only where the grammar is complete
    constraint.accept(tok)
    out = [tok]
    if budget > 1 and not constraint.done:
        more = constraint.forced()[: budget - 1]
        if more:
            constraint.accept_all(more)
            out += more
    return out
