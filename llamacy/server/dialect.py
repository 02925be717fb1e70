"""What the non-OpenAI dialects (Ollama, Anthropic) share beyond the answer loops (server/answer.py):
durations in nanoseconds. (Their errors take their own shapes in errors.render_error, by path.)"""

from __future__ import annotations


def ns(ms: float) -> int:
    """Milliseconds as the integer nanoseconds Ollama reports durations in."""
    return round(ms * 1_000_000)
