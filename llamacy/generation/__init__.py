"""Generation, written once: the per-token steps (steps.py: sampling, stop handling, verification of
drafts), the drafters (speculate.py) and context shift (shift.py), which the scheduler's Batcher
(llamacy/scheduler/batcher.py) takes for every sequence, and the Session (session.py, behind
Llama.generate_tokens): that Batcher with one slot, stepped in the caller's thread."""

from llamacy.generation.session import Completion, Session, Stats
from llamacy.generation.steps import (
    SequenceState,
    Step,
    TokenLogprob,
    check_prompt,
    sampling_params,
    token_logprob,
)

__all__ = [
    "Completion",
    "SequenceState",
    "Session",
    "Stats",
    "Step",
    "TokenLogprob",
    "check_prompt",
    "sampling_params",
    "token_logprob",
]
