"""Fitting a prompt longer than the context instead of refusing it (serve --context-shift; the Responses
API's truncation: "auto"). Off by default: the 400 that names the sizes stays the default answer, as
OpenAI's is.

- A conversation drops its oldest whole turns (the kept part starts with a user message), never its system
  prompt, until the prompt and room for a reply (a quarter of the context, as `llamacy chat` keeps) fit.
- A plain prompt keeps its first `keep` tokens (--keep) and drops llama.cpp's blocks of half of the rest of
  the context from after them, so that the end of the prompt, where generation continues, is kept.

The kept tokens are evaluated as a prompt of their own (a slot's cache still serves their common prefix),
which is exact for every layer kind: no cached key is re-rotated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from llamacy.generation.shift import truncate_prompt

__all__ = ["fit_messages", "reserve", "truncate_prompt"]

T = TypeVar("T")


def reserve(n_ctx: int) -> int:
    """Room kept for a reply when deciding which turns fit."""
    return max(1, n_ctx // 4)


def fit_messages(
    messages: list[dict[str, Any]], encode: Callable[[list[dict[str, Any]]], tuple[T, list[int]]], n_ctx: int
) -> tuple[list[dict[str, Any]], T, list[int]]:
    """The messages to keep, and encode()'s result for them: all of them if they fit with room for a reply;
    else without the oldest turns (the first that fits, or the last user turn alone)."""
    extra, ids = encode(messages)
    room = n_ctx - reserve(n_ctx)
    if len(ids) <= room:
        return messages, extra, ids
    head = 1 if messages and messages[0].get("role") in ("system", "developer") else 0
    starts = [i for i in range(head + 1, len(messages)) if messages[i].get("role") == "user"]
    best = (messages, extra, ids)
    for i in starts:
        kept = messages[:head] + messages[i:]
        extra, ids = encode(kept)
        best = (kept, extra, ids)
        if len(ids) <= room:
            break
    return best
