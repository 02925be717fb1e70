"""What the non-OpenAI dialects (Ollama, Anthropic) share: waiting for a request that is not streamed, and
durations in nanoseconds. (Their errors take their own shapes in errors.render_error, by path.)"""

from __future__ import annotations

from starlette.requests import Request

import llamacy.server.generation as gen
from llamacy.scheduler import Done, Failed, Piece, TokenLogprob


async def collect(request: Request, call: gen.Generation) -> tuple[Done | Failed, list[TokenLogprob]]:
    """The end of a one-request call that is not streamed, and the logprobs of its tokens."""
    lps: list[TokenLogprob] = []
    async with gen.cancel_on_disconnect(request, call):
        async for _, ev in call.events:
            if isinstance(ev, Piece):
                lps.extend(ev.logprobs or ())
            else:
                return ev, lps
    raise AssertionError("the event stream ended without Done or Failed")


def ns(ms: float) -> int:
    """Milliseconds as the integer nanoseconds Ollama reports durations in."""
    return round(ms * 1_000_000)
