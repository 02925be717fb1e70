"""Generation, written once: the per-token steps (steps.py) that both the single-sequence session
(session.py, behind Llama.generate_tokens) and the continuous-batching scheduler (llamacy/scheduler/) take."""

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
